//! Chunk placement by rendezvous (highest-random-weight) hashing: every chunk
//! ranks every node by hash(node, chunk) and takes the top `n`. Adding or
//! removing a node moves only the chunks whose top-n set contained it, about
//! 1/N of them, unlike hash mod N which reshuffles nearly everything.

use crate::proto::ChunkId;

/// FNV-1a over the node id, then mixed with the chunk coordinates (splitmix64):
/// stable across processes and releases, which placement needs.
fn score(node: &str, ino: u64, idx: u64) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in node.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100000001b3);
    }
    let mut x = h ^ ino.wrapping_mul(0x9e3779b97f4a7c15) ^ idx.rotate_left(31);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d049bb133111eb);
    x ^ (x >> 31)
}

/// All `nodes` ordered by preference for the chunk (ino, idx); versions of one
/// chunk land on the same nodes so rewrites replace in place.
pub fn rank<'a>(nodes: &'a [String], chunk: &ChunkId) -> Vec<&'a str> {
    let mut v: Vec<(u64, &str)> = nodes.iter().map(|n| (score(n, chunk.ino, chunk.idx), n.as_str())).collect();
    v.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
    v.into_iter().map(|(_, n)| n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("127.0.0.1:{}", 7000 + i)).collect()
    }

    #[test]
    fn adding_a_node_moves_only_its_share() {
        let (before, after) = (nodes(4), nodes(5));
        let total = 10_000;
        let mut moved = 0;
        for i in 0..total {
            let c = ChunkId { ino: i / 7, idx: i % 7, ver: 1 };
            let a = rank(&before, &c)[0];
            let b = rank(&after, &c)[0];
            if a != b {
                assert_eq!(b, after[4], "a chunk may only move to the new node");
                moved += 1;
            }
        }
        // Expected share 1/5 = 2000; allow sampling noise.
        assert!((1500..2500).contains(&moved), "moved {moved} of {total}");
    }

    #[test]
    fn ranking_is_a_permutation_and_stable() {
        let n = nodes(3);
        let c = ChunkId { ino: 9, idx: 2, ver: 5 };
        let r = rank(&n, &c);
        assert_eq!(r.len(), 3);
        assert_eq!(r, rank(&n, &ChunkId { ver: 6, ..c }), "versions share placement");
    }
}
