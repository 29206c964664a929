//! The system calls that build a container's tree, as root, in the agent: paths inside the
//! container are always resolved *inside* it (`openat2` with `RESOLVE_IN_ROOT`), so a symbolic
//! link in an image (`/data -> /etc`) can never aim a mount at the node's own files; binds are
//! cloned and attached through descriptors (`open_tree`, `mount_setattr`, `move_mount`), so what
//! is mounted is what was opened and checked, with its flags set before anyone can see it.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

const OPEN_TREE_CLONE: libc::c_uint = 1;
const AT_RECURSIVE: libc::c_uint = 0x8000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;
pub const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub const MOUNT_ATTR_NODEV: u64 = 0x4;
pub const MOUNT_ATTR_NOEXEC: u64 = 0x8;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::other(format!("{} contains a NUL byte", p.display())))
}

fn check(r: libc::c_long) -> io::Result<libc::c_long> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// `open(path, O_PATH)`, following links as the caller's identity allows.
pub fn open_path(path: &Path) -> io::Result<OwnedFd> {
    let p = cpath(path)?;
    // SAFETY: a NUL-terminated path; the result is a new descriptor or -1.
    let fd = check(unsafe { libc::open(p.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) }.into())?;
    // SAFETY: just opened, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// The container root itself, for [`in_root`].
pub fn open_root(root: &Path) -> io::Result<OwnedFd> {
    let p = cpath(root)?;
    // SAFETY: as open_path.
    let fd = check(unsafe { libc::open(p.as_ptr(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) }.into())?;
    // SAFETY: just opened.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

fn openat2(dir: &OwnedFd, rel: &Path, flags: i32) -> io::Result<OwnedFd> {
    let p = cpath(if rel.as_os_str().is_empty() { Path::new(".") } else { rel })?;
    // SAFETY: open_how is plain data; all zero is its empty value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_IN_ROOT;
    // SAFETY: openat2 with a live descriptor, a NUL-terminated path and an open_how of its size.
    let fd = check(unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            p.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    })?;
    // SAFETY: just opened.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// What [`in_root`] makes where nothing is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
}

/// `path` inside the container whose root is `root` (an `O_PATH` descriptor of it), resolved as
/// if `root` were `/` (links included); missing directories on the way are made (0755, root's),
/// and the last one as `kind`.
pub fn in_root(root: &OwnedFd, path: &Path, kind: Kind) -> io::Result<OwnedFd> {
    let parts: Vec<&OsStr> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(p) => Some(Ok(p)),
            Component::RootDir | Component::CurDir => None,
            _ => Some(Err(io::Error::other(format!("{} has a '..'", path.display())))),
        })
        .collect::<io::Result<_>>()?;
    let mut so_far = std::path::PathBuf::new();
    for (i, part) in parts.iter().enumerate() {
        let parent = openat2(root, &so_far, libc::O_PATH | libc::O_DIRECTORY)?;
        so_far.push(part);
        match openat2(root, &so_far, libc::O_PATH) {
            Ok(fd) if i + 1 == parts.len() => return Ok(fd),
            Ok(_) => continue,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(e),
        }
        let name = CString::new(part.as_bytes()).map_err(io::Error::other)?;
        let last = i + 1 == parts.len();
        // SAFETY: *at calls on a live directory descriptor with a NUL-terminated name; nothing
        // made here follows a link (a link to nowhere is refused, never created through).
        unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstatat(parent.as_raw_fd(), name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) == 0 {
                return Err(io::Error::other(format!(
                    "{} is a symbolic link to nothing in the container",
                    so_far.display()
                )));
            }
            let (fd, mode) = if last && kind == Kind::File {
                let flags = libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
                (libc::openat(parent.as_raw_fd(), name.as_ptr(), flags, 0o644), 0o644)
            } else {
                if libc::mkdirat(parent.as_raw_fd(), name.as_ptr(), 0o755) != 0 {
                    return Err(io::Error::last_os_error());
                }
                let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
                (libc::openat(parent.as_raw_fd(), name.as_ptr(), flags), 0o755)
            };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            // The agent's umask (077) is not the container's.
            let chmod = libc::fchmod(fd, mode);
            libc::close(fd);
            check(chmod.into())?;
        }
    }
    openat2(root, &so_far, libc::O_PATH)
}

/// `path` inside the container when it exists there (resolved as [`in_root`] does).
pub fn in_root_existing(root: &OwnedFd, path: &Path) -> Option<OwnedFd> {
    openat2(root, path, libc::O_PATH).ok()
}

/// Whether `fd` is a directory.
pub fn is_dir(fd: &OwnedFd) -> io::Result<bool> {
    // SAFETY: fstat fills the struct it is given.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a live descriptor and a live struct.
    check(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }.into())?;
    Ok(st.st_mode & libc::S_IFMT == libc::S_IFDIR)
}

/// Binds what `source` is onto `target` (with what is mounted below it when `recursive`), with
/// `attrs` (`MOUNT_ATTR_*`) set on the new mount(s) before they are attached, private.
pub fn bind(source: &OwnedFd, target: &OwnedFd, recursive: bool, attrs: u64) -> io::Result<()> {
    let rec = if recursive { AT_RECURSIVE } else { 0 };
    // SAFETY: open_tree on a live descriptor with an empty path; a new descriptor or -1.
    let tree = check(unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            source.as_raw_fd(),
            c"".as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | libc::AT_EMPTY_PATH as libc::c_uint | rec,
        )
    })?;
    // SAFETY: just opened.
    let tree = unsafe { OwnedFd::from_raw_fd(tree as RawFd) };
    let attr = MountAttr { attr_set: attrs, attr_clr: 0, propagation: libc::MS_PRIVATE, userns_fd: 0 };
    // SAFETY: mount_setattr on a live descriptor with a struct of the size given.
    check(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint | rec,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })?;
    // SAFETY: move_mount between two live descriptors with empty paths.
    check(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            target.as_raw_fd(),
            c"".as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    })?;
    Ok(())
}

/// A user namespace that maps 0 to `uid` and 0 to `gid`, one id each, for idmapped mounts:
/// made by a child that unshares one and waits while this process writes its maps.
pub fn user_namespace(uid: u32, gid: u32) -> io::Result<OwnedFd> {
    let mut ready = [0 as RawFd; 2];
    let mut done = [0 as RawFd; 2];
    // SAFETY: pipe2 fills the arrays it is given.
    unsafe {
        check(libc::pipe2(ready.as_mut_ptr(), libc::O_CLOEXEC).into())?;
        if libc::pipe2(done.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            let e = io::Error::last_os_error();
            libc::close(ready[0]);
            libc::close(ready[1]);
            return Err(e);
        }
    }
    // SAFETY: the child only calls unshare, write, read and _exit (async-signal-safe).
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: see above; never returns.
        unsafe {
            libc::close(ready[0]);
            libc::close(done[1]);
            let ok: u8 = u8::from(libc::unshare(libc::CLONE_NEWUSER) == 0);
            libc::write(ready[1], (&ok as *const u8).cast(), 1);
            let mut b = 0u8;
            libc::read(done[0], (&mut b as *mut u8).cast(), 1);
            libc::_exit(0);
        }
    }
    // SAFETY: closing our copies of the child's ends.
    unsafe {
        libc::close(ready[1]);
        libc::close(done[0]);
    }
    let result = (|| {
        if pid < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut ok = 0u8;
        // SAFETY: reads one byte into a live local.
        if unsafe { libc::read(ready[0], (&mut ok as *mut u8).cast(), 1) } != 1 || ok != 1 {
            return Err(io::Error::other("could not make a user namespace"));
        }
        std::fs::write(format!("/proc/{pid}/uid_map"), format!("0 {uid} 1\n"))?;
        std::fs::write(format!("/proc/{pid}/gid_map"), format!("0 {gid} 1\n"))?;
        let ns = std::fs::File::open(format!("/proc/{pid}/ns/user"))?;
        Ok(OwnedFd::from(ns))
    })();
    // SAFETY: ends the child (closing its pipe wakes it) and reaps it.
    unsafe {
        libc::close(ready[0]);
        libc::close(done[1]);
        if pid > 0 {
            // Whoever else holds the pipe (a fork elsewhere meanwhile), the child ends.
            libc::kill(pid, libc::SIGKILL);
            let mut status = 0;
            libc::waitpid(pid, &mut status, 0);
        }
    }
    result
}

/// A copy of the mount at `source` (a layer's directory) seen through `userns`'s mapping (an
/// idmapped mount), attached at `target`, read-only.
pub fn idmapped(source: &OwnedFd, userns: &OwnedFd, target: &Path) -> io::Result<()> {
    // SAFETY: as in bind.
    let tree = check(unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            source.as_raw_fd(),
            c"".as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | libc::AT_EMPTY_PATH as libc::c_uint,
        )
    })?;
    // SAFETY: just opened.
    let tree = unsafe { OwnedFd::from_raw_fd(tree as RawFd) };
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        attr_clr: 0,
        propagation: libc::MS_PRIVATE,
        userns_fd: userns.as_raw_fd() as u64,
    };
    // SAFETY: as in bind.
    check(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })?;
    let t = cpath(target)?;
    // SAFETY: move_mount from a live descriptor to a NUL-terminated path.
    check(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    })?;
    Ok(())
}

/// Every mount point at or under `dir`, deepest first.
pub fn mounts_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") else { return Vec::new() };
    let mut found: Vec<std::path::PathBuf> = table
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| std::path::PathBuf::from(OsStr::from_bytes(&unescape(m))))
        .filter(|p| p.starts_with(dir))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    found.dedup();
    found
}

/// `chown` of what `fd` (an `O_PATH` descriptor) is.
pub fn chown(fd: &OwnedFd, uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: fchownat on a live descriptor with an empty path.
    check(unsafe { libc::fchownat(fd.as_raw_fd(), c"".as_ptr(), uid, gid, libc::AT_EMPTY_PATH) }.into()).map(|_| ())
}

/// Sets `attrs` on the mount at `path` (and those below it).
pub fn set_attrs(path: &Path, attrs: u64) -> io::Result<()> {
    let p = cpath(path)?;
    let attr = MountAttr { attr_set: attrs, attr_clr: 0, propagation: 0, userns_fd: 0 };
    // SAFETY: mount_setattr on a NUL-terminated path with a struct of the size given.
    check(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            p.as_ptr(),
            AT_RECURSIVE,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })?;
    Ok(())
}

/// Mounts a new file system of `fstype` onto what `target` is.
pub fn mount_new(fstype: &str, target: &OwnedFd, flags: libc::c_ulong, data: &str) -> io::Result<()> {
    let t = CString::new(format!("/proc/self/fd/{}", target.as_raw_fd())).map_err(io::Error::other)?;
    let fs = CString::new(fstype).map_err(io::Error::other)?;
    let d = CString::new(data).map_err(io::Error::other)?;
    // Under the containers' private mount, so private itself. (The descriptor still names the
    // directory beneath, not the new mount: nothing more is done through it.)
    // SAFETY: NUL-terminated strings that live across the call.
    check(unsafe { libc::mount(fs.as_ptr(), t.as_ptr(), fs.as_ptr(), flags, d.as_ptr().cast()) }.into())?;
    Ok(())
}

/// `mount(fstype, target, fstype, flags, data)`, then private.
pub fn mount_at(fstype: &str, target: &std::ffi::CStr, flags: libc::c_ulong, data: &str) -> io::Result<()> {
    let fs = CString::new(fstype).map_err(io::Error::other)?;
    let d = CString::new(data).map_err(io::Error::other)?;
    // SAFETY: NUL-terminated strings that live across the call.
    check(unsafe { libc::mount(fs.as_ptr(), target.as_ptr(), fs.as_ptr(), flags, d.as_ptr().cast()) }.into())?;
    // SAFETY: as above, with no data.
    check(
        unsafe { libc::mount(std::ptr::null(), target.as_ptr(), std::ptr::null(), libc::MS_PRIVATE, std::ptr::null()) }
            .into(),
    )?;
    Ok(())
}

/// Detaches the mount at `path` and every mount below it.
pub fn detach(path: &Path) -> io::Result<()> {
    let p = cpath(path)?;
    // SAFETY: a NUL-terminated path.
    check(unsafe { libc::umount2(p.as_ptr(), libc::MNT_DETACH) }.into()).map(|_| ())
}

/// Whether a file system is mounted at `path` (per this process's mount table).
pub fn is_mount_point(path: &Path) -> bool {
    let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") else { return false };
    let want = path.as_os_str().as_bytes();
    table.lines().any(|l| l.split(' ').nth(4).is_some_and(|m| unescape(m).as_slice() == want))
}

/// mountinfo's `\040`-style escapes undone.
fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// `mknodat` of a character device `major:minor` named `name` in the directory `dir`, mode 0666.
pub fn char_device(dir: &OwnedFd, name: &str, major: u32, minor: u32) -> io::Result<()> {
    let n = CString::new(name).map_err(io::Error::other)?;
    // SAFETY: *at calls on a live directory descriptor and a NUL-terminated name.
    unsafe {
        if libc::mknodat(dir.as_raw_fd(), n.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(major, minor)) != 0
            && io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST)
        {
            return Err(io::Error::last_os_error());
        }
        check(libc::fchmodat(dir.as_raw_fd(), n.as_ptr(), 0o666, 0).into())?;
    }
    Ok(())
}

/// A symbolic link `name` -> `target` in `dir`.
pub fn symlink(dir: &OwnedFd, name: &str, target: &str) -> io::Result<()> {
    let (n, t) = (CString::new(name).map_err(io::Error::other)?, CString::new(target).map_err(io::Error::other)?);
    // SAFETY: symlinkat with NUL-terminated strings and a live descriptor.
    if unsafe { libc::symlinkat(t.as_ptr(), dir.as_raw_fd(), n.as_ptr()) } != 0
        && io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST)
    {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A directory `name` in `dir` with exactly `mode`.
pub fn dir_with_mode(dir: &OwnedFd, name: &str, mode: u32) -> io::Result<()> {
    let n = CString::new(name).map_err(io::Error::other)?;
    // SAFETY: *at calls on a live directory descriptor and a NUL-terminated name.
    unsafe {
        if libc::mkdirat(dir.as_raw_fd(), n.as_ptr(), mode) != 0
            && io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST)
        {
            return Err(io::Error::last_os_error());
        }
        check(libc::fchmodat(dir.as_raw_fd(), n.as_ptr(), mode, 0).into())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_inside_a_root_never_leave_it() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("real")).unwrap();
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        // An image's links: to an absolute path of the node, climbing out, and to its own dir.
        std::os::unix::fs::symlink(&outside, root.join("abs")).unwrap();
        std::os::unix::fs::symlink("../../outside", root.join("up")).unwrap();
        std::os::unix::fs::symlink("/real", root.join("own")).unwrap();
        let r = open_root(&root).unwrap();
        // Inside the root, both lead nowhere: refused, and nothing is made outside.
        assert!(in_root(&r, Path::new("/abs/made"), Kind::Dir).unwrap_err().to_string().contains("symbolic link"));
        assert!(in_root(&r, Path::new("/up/file"), Kind::File).is_err());
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
        // A link within the image is followed within it.
        in_root(&r, Path::new("/own/made/deeper"), Kind::Dir).unwrap();
        in_root(&r, Path::new("/own/file"), Kind::File).unwrap();
        assert!(root.join("real/made/deeper").is_dir() && root.join("real/file").is_file());
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(root.join("real/made")).unwrap().permissions().mode() & 0o777, 0o755);
        assert!(in_root(&r, Path::new("/a/../b"), Kind::Dir).is_err());
    }

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(unescape(r"/a\040b"), b"/a b");
        assert_eq!(unescape("/plain"), b"/plain");
        assert!(is_mount_point(Path::new("/")));
    }
}
