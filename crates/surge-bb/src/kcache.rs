//! What the mount's kernel has cached, as far as close-to-open needs to know.
//!
//! The kernel keeps names (dentries) and attributes for `attr_ttl`, and file
//! pages until an open drops them. Another mount may change any of these
//! meanwhile, so every open reads the file's attributes and the placement of
//! its directories from metadata, and checks them against what this mount
//! told its kernel:
//! - [`KernelNames`]: a name this mount handed out that no longer leads where
//!   the kernel thinks fails the open with ESTALE; the kernel then walks the
//!   path again, asking every name afresh (as NFS clients do).
//! - [`PageGenerations`]: pages are kept across an open only when the file's
//!   content generation is the one read at its previous open here.

use crate::meta::{Attr, Ino, Placement};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Each file's content generation at its last open on this mount. The
/// kernel's cached pages of a file hold bytes of that generation, or this
/// mount's own writes, whose commits bump it: so an open that reads the same
/// generation may keep them, and any other open must drop them.
#[derive(Default)]
pub struct PageGenerations(HashMap<Ino, u64>);

impl PageGenerations {
    /// Files remembered; past this the map starts over (their next opens
    /// drop pages they could have kept, nothing more).
    const MAX: usize = 1 << 20;

    /// Notes `gen` as `ino`'s at an open: true when the previous open here
    /// read the same generation.
    pub fn reopened_unchanged(&mut self, ino: Ino, gen: u64) -> bool {
        if self.0.len() >= Self::MAX && !self.0.contains_key(&ino) {
            self.0.clear();
        }
        self.0.insert(ino, gen) == Some(gen)
    }
}

/// A name handed to the kernel with a lifetime, and when.
struct Told {
    parent: Ino,
    name: String,
    at: Instant,
}

/// The names this mount's kernel may hold: (parent, name) -> inode, as told
/// in the last `2 x ttl` (older ones have expired in the kernel, which asks
/// again before using them). There are no hard links: an inode has one name.
pub struct KernelNames {
    ttl: Duration,
    by_ino: HashMap<Ino, Told>,
    by_name: HashMap<(Ino, String), Ino>,
    since_prune: usize,
}

impl KernelNames {
    /// Names recorded between two prunes of expired ones.
    const PRUNE_EVERY: usize = 4096;

    /// Names cached by the kernel for `ttl`; zero: none are (nothing to track).
    pub fn new(ttl: Duration) -> KernelNames {
        KernelNames { ttl, by_ino: HashMap::new(), by_name: HashMap::new(), since_prune: 0 }
    }

    /// The kernel was told, at `now`, that `name` in `parent` is `ino`.
    pub fn told(&mut self, parent: Ino, name: &str, ino: Ino, now: Instant) {
        if self.ttl.is_zero() {
            return;
        }
        self.forget_ino(ino);
        self.forget_name(parent, name);
        self.by_name.insert((parent, name.to_string()), ino);
        self.by_ino.insert(ino, Told { parent, name: name.to_string(), at: now });
        self.since_prune += 1;
        if self.since_prune >= Self::PRUNE_EVERY {
            self.prune(now);
        }
    }

    /// The kernel removed `name` from `parent` itself (unlink, rmdir).
    pub fn forget_name(&mut self, parent: Ino, name: &str) {
        if let Some(ino) = self.by_name.remove(&(parent, name.to_string())) {
            self.by_ino.remove(&ino);
        }
    }

    fn forget_ino(&mut self, ino: Ino) {
        if let Some(t) = self.by_ino.remove(&ino) {
            self.by_name.remove(&(t.parent, t.name));
        }
    }

    /// The kernel moved `name` itself (a rename through this mount), over
    /// whatever `new_name` was.
    pub fn renamed(&mut self, parent: Ino, name: &str, new_parent: Ino, new_name: &str, now: Instant) {
        let moved = self.by_name.get(&(parent, name.to_string())).copied();
        self.forget_name(parent, name);
        self.forget_name(new_parent, new_name);
        if let Some(ino) = moved {
            self.told(new_parent, new_name, ino, now);
        }
    }

    /// Checks an opened file's attributes and its directories' placements
    /// (read from metadata at the open) against the names told: true when
    /// none the kernel may hold has moved. Moved ones are forgotten, so the
    /// kernel's walk again (after ESTALE) passes, even from a working
    /// directory that moved (a process's cwd follows its directory).
    pub fn still_true(&mut self, file: &Attr, dirs: &[Placement]) -> bool {
        let places = std::iter::once((file.ino, file.parent, file.name.as_str())).chain(dirs.iter().map(|p| (p.ino, p.parent, p.name.as_str())));
        let moved: Vec<Ino> = places
            .filter(|&(ino, parent, name)| self.by_ino.get(&ino).is_some_and(|t| t.parent != parent || t.name != name))
            .map(|(ino, _, _)| ino)
            .collect();
        for &ino in &moved {
            self.forget_ino(ino);
        }
        moved.is_empty()
    }

    /// An open found `ino` gone: true when the kernel reached it by a name
    /// this mount told (then forgotten), i.e. the name may now lead elsewhere.
    pub fn was_told(&mut self, ino: Ino) -> bool {
        let known = self.by_ino.contains_key(&ino);
        self.forget_ino(ino);
        known
    }

    /// Forgets names told more than `2 x ttl` before `now`: the kernel has
    /// let them expire and asks for them again before use.
    pub fn prune(&mut self, now: Instant) {
        let keep = self.ttl * 2;
        let by_name = &mut self.by_name;
        self.by_ino.retain(|_, t| {
            let live = now.saturating_duration_since(t.at) <= keep;
            if !live {
                by_name.remove(&(t.parent, std::mem::take(&mut t.name)));
            }
            live
        });
        self.since_prune = 0;
    }

    pub fn len(&self) -> usize {
        self.by_ino.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_ino.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::Kind;

    fn file(ino: Ino, parent: Ino, name: &str) -> Attr {
        Attr {
            ino,
            kind: Kind::File,
            mode: 0o644,
            uid: 0,
            gid: 0,
            size: 0,
            mtime_ns: 0,
            ctime_ns: 0,
            atime_ns: 0,
            nlink: 1,
            gen: 0,
            pgen: 0,
            parent,
            name: name.into(),
            import: None,
            xkey: None,
        }
    }

    fn dir(ino: Ino, parent: Ino, name: &str) -> Placement {
        Placement { ino, parent, name: name.into() }
    }

    fn names() -> (KernelNames, Instant) {
        (KernelNames::new(Duration::from_secs(1)), Instant::now())
    }

    #[test]
    fn pages_are_kept_only_across_an_unchanged_generation() {
        let mut p = PageGenerations::default();
        assert!(!p.reopened_unchanged(7, 3), "a first open has no pages to keep");
        assert!(p.reopened_unchanged(7, 3));
        assert!(!p.reopened_unchanged(7, 4), "a commit since the last open");
        assert!(p.reopened_unchanged(7, 4));
        assert!(!p.reopened_unchanged(8, 4), "another file");
    }

    #[test]
    fn a_file_renamed_away_by_another_mount_is_caught_once() {
        let (mut k, t) = names();
        k.told(1, "d", 10, t);
        k.told(10, "f", 20, t);
        // Another mount renamed d/f to d/g: the kernel's d/f leads to 20.
        assert!(!k.still_true(&file(20, 10, "g"), &[dir(10, 1, "d")]));
        // The walk again asks afresh; its answer (no d/f, or a new one) is told.
        assert!(k.still_true(&file(20, 10, "g"), &[dir(10, 1, "d")]));
    }

    #[test]
    fn a_directory_replaced_by_another_mount_is_caught() {
        let (mut k, t) = names();
        k.told(1, "out", 10, t);
        k.told(10, "ckpt", 20, t);
        // Another mount: mv out out.old; mkdir out; the file kept its name in 10.
        assert!(!k.still_true(&file(20, 10, "ckpt"), &[dir(10, 1, "out.old")]));
        assert!(k.still_true(&file(20, 10, "ckpt"), &[dir(10, 1, "out.old")]), "a cwd in the moved directory still opens");
    }

    #[test]
    fn names_nobody_moved_pass_and_untold_ones_are_not_judged() {
        let (mut k, t) = names();
        k.told(1, "d", 10, t);
        k.told(10, "f", 20, t);
        assert!(k.still_true(&file(20, 10, "f"), &[dir(10, 1, "d")]));
        assert!(k.still_true(&file(30, 40, "x"), &[dir(40, 1, "e")]));
    }

    #[test]
    fn this_mounts_own_renames_and_unlinks_keep_the_names_true() {
        let (mut k, t) = names();
        k.told(1, "tmp", 20, t);
        k.told(1, "out", 21, t);
        k.renamed(1, "tmp", 1, "out", t);
        assert!(k.still_true(&file(20, 1, "out"), &[]));
        assert!(!k.was_told(21), "the replaced file's name went with the rename");
        k.told(1, "x", 22, t);
        k.forget_name(1, "x");
        assert!(!k.was_told(22));
    }

    #[test]
    fn a_gone_file_reached_by_a_told_name_is_stale_once() {
        let (mut k, t) = names();
        k.told(1, "f", 20, t);
        assert!(k.was_told(20));
        assert!(!k.was_told(20));
    }

    #[test]
    fn expired_names_are_pruned_and_a_zero_ttl_tracks_nothing() {
        let (mut k, t) = names();
        k.told(1, "a", 20, t);
        k.told(1, "b", 21, t + Duration::from_millis(1500));
        k.prune(t + Duration::from_millis(2500));
        assert_eq!(k.len(), 1, "a was told 2.5 s ago, b 1 s ago");
        assert!(!k.was_told(20) && k.was_told(21));
        let mut z = KernelNames::new(Duration::ZERO);
        z.told(1, "a", 20, t);
        assert!(z.is_empty());
    }
}
