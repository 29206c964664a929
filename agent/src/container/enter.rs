//! Entering a container, between a task's fork and its exec: only async-signal-safe system
//! calls, on memory prepared before the fork.
//!
//! The container's whole tree (its root file system and every mount inside it) was made by the
//! agent beforehand ([`super::Containers::open`]); a task only needs a mount namespace of its own
//! whose root is that tree ([`Enter::root`], as root, before the task drops its privileges) and,
//! once it is the job's user, a user namespace of its own ([`Enter::user`]) that maps that user to
//! itself, or to 0 with `--container-remap-root`: one uid and one gid mapped, nothing more, so a
//! set-user-ID file in an image grants nothing, and `no_new_privs` holds after the exec.

use std::ffi::CString;
use std::io;
use std::path::Path;

/// What a task needs to enter its container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Enter {
    /// The container's tree in the agent's mount namespace.
    pub root: CString,
    /// `/proc/self/uid_map` and `gid_map`, written from inside the new user namespace; `None`
    /// when the task stays root (a job of root's that is not remapped).
    pub maps: Option<(CString, CString)>,
}

impl Enter {
    /// For a task of `uid`:`gid`, root inside with `remap_root`.
    pub fn new(root: &Path, uid: u32, gid: u32, remap_root: bool) -> io::Result<Enter> {
        let c = |s: String| CString::new(s).map_err(|_| io::Error::other("a NUL byte in a container path"));
        let maps = if uid == 0 && !remap_root {
            None
        } else {
            let (inside_uid, inside_gid) = if remap_root { (0, 0) } else { (uid, gid) };
            Some((c(format!("{inside_uid} {uid} 1\n"))?, c(format!("{inside_gid} {gid} 1\n"))?))
        };
        Ok(Enter { root: c(root.display().to_string())?, maps })
    }

    /// Makes the container's tree this process's root, in a mount namespace of its own. As root,
    /// before the process becomes the job's user. On failure errno says why.
    ///
    /// # Safety
    /// Between fork and exec only.
    pub unsafe fn root(&self) -> bool {
        let none = std::ptr::null::<libc::c_char>();
        let root = self.root.as_ptr();
        libc::unshare(libc::CLONE_NEWNS) == 0
            // Nothing done here reaches the agent's namespace.
            && libc::mount(none, c"/".as_ptr(), none, libc::MS_REC | libc::MS_PRIVATE, std::ptr::null()) == 0
            && libc::mount(root, root, none, libc::MS_BIND | libc::MS_REC, std::ptr::null()) == 0
            && libc::chdir(root) == 0
            // The old root is stacked under the new one, then detached: nothing of the node's
            // file system stays reachable.
            && libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) == 0
            && libc::umount2(c".".as_ptr(), libc::MNT_DETACH) == 0
            && libc::chdir(c"/".as_ptr()) == 0
    }

    /// A user namespace of its own mapping this process's (now the job's) uid and gid, and no
    /// new privileges from any exec. After `setuid`. On failure errno says why.
    ///
    /// # Safety
    /// Between fork and exec only.
    pub unsafe fn user(&self) -> bool {
        if let Some((uid_map, gid_map)) = &self.maps {
            // setuid made the process undumpable, which makes /proc/self root's: its own again.
            if libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) != 0
                || libc::unshare(libc::CLONE_NEWUSER) != 0
                || !write_file(c"/proc/self/uid_map", uid_map.as_bytes())
                || !write_file(c"/proc/self/setgroups", b"deny")
                || !write_file(c"/proc/self/gid_map", gid_map.as_bytes())
            {
                return false;
            }
        }
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
    }
}

/// Writes `data` to `path` in one write. Async-signal-safe.
unsafe fn write_file(path: &std::ffi::CStr, data: &[u8]) -> bool {
    let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
    if fd < 0 {
        return false;
    }
    let ok = libc::write(fd, data.as_ptr().cast(), data.len()) == data.len() as isize;
    let saved = *libc::__errno_location();
    libc::close(fd);
    *libc::__errno_location() = saved;
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_name_one_id_each() {
        let e = Enter::new(Path::new("/c/root"), 1000, 100, false).unwrap();
        let (u, g) = e.maps.unwrap();
        assert_eq!((u.to_str().unwrap(), g.to_str().unwrap()), ("1000 1000 1\n", "100 100 1\n"));
        let r = Enter::new(Path::new("/c/root"), 1000, 100, true).unwrap();
        let (u, g) = r.maps.unwrap();
        assert_eq!((u.to_str().unwrap(), g.to_str().unwrap()), ("0 1000 1\n", "0 100 1\n"));
        assert!(Enter::new(Path::new("/c/root"), 0, 0, false).unwrap().maps.is_none());
    }
}
