//! The bounded, stable fuzz loop run in CI: replay every corpus and regression
//! file of every target, then mutate them (seeded; bit flips, byte sets,
//! inserts, deletes, splices, interesting integers) for `SURGE_FUZZ_SECS` seconds
//! per target (default 8). A panic saves the input under
//! `target/fuzz-findings/` and fails the test with its path and the seed.
//! Long coverage-guided runs use `cargo +nightly fuzz run --features libfuzzer TARGET`.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use surge_fuzz::{seeds, TARGETS};

fn files(dir: &Path) -> Vec<Vec<u8>> {
    let mut paths: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(rd) => rd.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.is_file()).collect(),
        Err(_) => return Vec::new(),
    };
    paths.sort();
    paths.iter().map(|p| std::fs::read(p).unwrap()).collect()
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Run one input; on panic save it and fail.
fn run_one(name: &str, f: fn(&[u8]), input: &[u8], what: &str) {
    if catch_unwind(AssertUnwindSafe(|| f(input))).is_err() {
        let dir = root().join("target/fuzz-findings").join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("crash-{:016x}", fxhash(input)));
        std::fs::write(&path, input).unwrap();
        panic!("{name}: {what} panicked; input saved to {} (add it to fuzz/regressions/{name}/ once fixed)", path.display());
    }
}

fn fxhash(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| (h ^ x as u64).wrapping_mul(0x100_0000_01b3))
}

const INTERESTING: &[u64] = &[0, 1, 0x7f, 0x80, 0xff, 0x100, 0x7fff, 0xffff, 0x1_0000, 0x7fff_ffff, 0xffff_ffff, 1 << 20, 1 << 32, u64::MAX];

fn mutate(rng: &mut StdRng, input: &mut Vec<u8>, pool: &[Vec<u8>]) {
    for _ in 0..rng.gen_range(1..=4) {
        let len = input.len();
        match rng.gen_range(0..7) {
            0 if len > 0 => {
                let i = rng.gen_range(0..len);
                input[i] ^= 1 << rng.gen_range(0..8);
            }
            1 if len > 0 => {
                let i = rng.gen_range(0..len);
                input[i] = rng.gen();
            }
            2 => {
                let i = rng.gen_range(0..=len);
                let n = rng.gen_range(1..=16);
                let bytes: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
                input.splice(i..i, bytes);
            }
            3 if len > 0 => {
                let i = rng.gen_range(0..len);
                let n = rng.gen_range(1..=(len - i).min(32));
                input.drain(i..i + n);
            }
            4 if !pool.is_empty() => {
                // Splice a piece of another input in.
                let other = &pool[rng.gen_range(0..pool.len())];
                if !other.is_empty() {
                    let a = rng.gen_range(0..other.len());
                    let b = rng.gen_range(a..=other.len());
                    let i = rng.gen_range(0..=len);
                    input.splice(i..i, other[a..b].iter().copied());
                }
            }
            5 if len >= 8 => {
                // An interesting integer, big endian (NBD) or little endian (metadata).
                let v = INTERESTING[rng.gen_range(0..INTERESTING.len())];
                let w = [1usize, 2, 4, 8][rng.gen_range(0..4)];
                let i = rng.gen_range(0..=len - w);
                if rng.gen() {
                    input[i..i + w].copy_from_slice(&v.to_be_bytes()[8 - w..]);
                } else {
                    input[i..i + w].copy_from_slice(&v.to_le_bytes()[..w]);
                }
            }
            _ if len > 1 => input.truncate(rng.gen_range(0..len)),
            _ => input.push(rng.gen()),
        }
    }
}

#[test]
fn corpus_and_regressions_replay_cleanly() {
    for &(name, f) in TARGETS {
        let corpus = files(&root().join("corpus").join(name));
        assert!(!corpus.is_empty(), "{name}: no seed corpus in fuzz/corpus/{name}");
        for (i, input) in corpus.iter().enumerate() {
            run_one(name, f, input, &format!("corpus file #{i}"));
        }
        for (i, input) in files(&root().join("regressions").join(name)).iter().enumerate() {
            run_one(name, f, input, &format!("regression #{i}"));
        }
    }
}

#[test]
fn bounded_mutation_loop() {
    let secs: f64 = std::env::var("SURGE_FUZZ_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(8.0);
    let seed: u64 = std::env::var("SURGE_FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    for &(name, f) in TARGETS {
        let mut pool = files(&root().join("corpus").join(name));
        pool.extend(seeds(name));
        pool.extend(files(&root().join("regressions").join(name)));
        let mut rng = StdRng::seed_from_u64(seed ^ fxhash(name.as_bytes()));
        let end = Instant::now() + Duration::from_secs_f64(secs);
        let mut execs = 0u64;
        while Instant::now() < end {
            for _ in 0..64 {
                let mut input = pool[rng.gen_range(0..pool.len())].clone();
                mutate(&mut rng, &mut input, &pool);
                input.truncate(1 << 16);
                run_one(name, f, &input, &format!("mutated input (seed {seed}, execution {execs})"));
                execs += 1;
            }
        }
        eprintln!("fuzz {name}: {execs} executions in {secs} s without a panic (seed {seed})");
        assert!(execs > 0);
    }
}

/// `cargo test --release -p surge-fuzz -- --ignored write_seed_corpus` refreshes
/// the committed seed files from the generators.
#[test]
#[ignore]
fn write_seed_corpus() {
    for &(name, _) in TARGETS {
        let dir = root().join("corpus").join(name);
        std::fs::create_dir_all(&dir).unwrap();
        for (i, s) in seeds(name).iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i}")), s).unwrap();
        }
    }
}
