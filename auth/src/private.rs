//! What a daemon stores is as private as what it serves (DESIGN.md, "Trust"): the controllers'
//! data directories (the Raft log and snapshots hold every job's script and environment) and
//! the agents' spools (each job's launch) are the service's alone. Daemons start with a umask
//! that makes what they create theirs ([`restrict_umask`]), and each tree is made private again
//! on start ([`make_private`]), so that files an older release left readable are fixed too.

use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// The mode of a private directory.
pub const DIR_MODE: u32 = 0o700;
/// The mode of a private file.
pub const FILE_MODE: u32 = 0o600;

/// Sets the process's umask to 077: everything the process creates afterwards is its owner's
/// alone. For the daemons' `main`s (a library never changes its process's umask); the jobs an
/// agent starts get the umask their submitter had instead (`SLURM_UMASK`).
pub fn restrict_umask() {
    // SAFETY: umask cannot fail; it only replaces the process's mask.
    unsafe {
        libc::umask(0o077);
    }
}

/// Creates `dir` (and its parents) if missing, then makes it and everything under it private:
/// directories [`DIR_MODE`], files [`FILE_MODE`], owned as they are. Symbolic links are not
/// followed (a link is left as it is, and what it points to is not touched).
pub fn make_private(dir: &Path) -> io::Result<()> {
    std::fs::DirBuilder::new().recursive(true).mode(DIR_MODE).create(dir)?;
    restrict_tree(dir, &|_, is_dir| if is_dir { DIR_MODE } else { FILE_MODE })
}

/// Sets the mode of `dir` and of everything under it to `mode(path, is_dir)`, without following
/// symbolic links (never changing a link's target). An entry that vanishes meanwhile is fine.
pub fn restrict_tree(dir: &Path, mode: &dyn Fn(&Path, bool) -> u32) -> io::Result<()> {
    let meta = std::fs::symlink_metadata(dir)?;
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    let is_dir = meta.is_dir();
    let want = mode(dir, is_dir);
    if meta.permissions().mode() & 0o7777 != want {
        match std::fs::set_permissions(dir, std::fs::Permissions::from_mode(want)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    if is_dir {
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            match restrict_tree(&entry.path(), mode) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// Writes `bytes` to a new or truncated file at `path` with mode [`FILE_MODE`] whatever the
/// umask (an existing file's mode is set again too).
pub fn write(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    file.set_permissions(std::fs::Permissions::from_mode(FILE_MODE))?;
    file.write_all(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn a_tree_left_readable_is_made_private_without_following_links() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::write(&outside, "not ours").unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o644)).unwrap();
        let root = tmp.path().join("data");
        std::fs::create_dir_all(root.join("db/sub")).unwrap();
        for d in [&root, &root.join("db"), &root.join("db/sub")] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        std::fs::write(root.join("db/000001.log"), "secret").unwrap();
        std::fs::set_permissions(root.join("db/000001.log"), std::fs::Permissions::from_mode(0o644)).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("db/link")).unwrap();
        make_private(&root).unwrap();
        assert_eq!(mode(&root), 0o700);
        assert_eq!(mode(&root.join("db")), 0o700);
        assert_eq!(mode(&root.join("db/sub")), 0o700);
        assert_eq!(mode(&root.join("db/000001.log")), 0o600);
        assert_eq!(mode(&outside), 0o644, "a link's target is not touched");
        // A directory that does not exist yet is made private.
        let fresh = tmp.path().join("a/b/c");
        make_private(&fresh).unwrap();
        assert_eq!(mode(&fresh), 0o700);
    }

    #[test]
    fn a_private_write_is_the_owners_alone_whatever_the_umask() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("f");
        std::fs::write(&path, "old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        write(&path, b"new").unwrap();
        assert_eq!((mode(&path), std::fs::read_to_string(&path).unwrap().as_str()), (0o600, "new"));
        // Never through a link an attacker left in its place.
        let target = tmp.path().join("target");
        std::fs::write(&target, "keep").unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(write(&link, b"x").is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
    }
}
