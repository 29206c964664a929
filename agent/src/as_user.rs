//! Files read and opened as a job's user, by the agent (root): on a thread of its own whose
//! file-system identity is the user's, so that the user's permissions decide, never root's.
//! Nothing here knows the agent, so what opens files for users depends on this alone.

use std::path::Path;

use crate::identity;

/// Reads up to `max_bytes` of `path` from `offset`, opened as `account` when given: on this
/// thread alone (it ends after the read), the file-system identity becomes the user's (their
/// groups, `setfsgid`, `setfsuid`), so that every directory on the path and the file itself are
/// checked against the user, not root. Only a regular file is read, and the open does not block.
pub fn read_as(
    account: Option<&identity::Account>,
    path: &Path,
    offset: u64,
    max_bytes: u32,
) -> Result<Vec<u8>, String> {
    use std::io::{Read, Seek, SeekFrom};
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    if let Some(a) = account {
        become_for_files(a).map_err(|e| format!("cannot read as user {}: {e}", a.name))?;
    }
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let meta = file.metadata().map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("{} is not a regular file", path.display()));
    }
    // And one of the user's own: a job's output is written by the job, as its user.
    if let Some(a) = account.filter(|a| a.uid != meta.uid()) {
        return Err(format!(
            "{} belongs to uid {}, not to the job's user {} (uid {})",
            path.display(),
            meta.uid(),
            a.name,
            a.uid
        ));
    }
    file.seek(SeekFrom::Start(offset)).map_err(|e| e.to_string())?;
    let mut data = Vec::new();
    file.take(u64::from(max_bytes)).read_to_end(&mut data).map_err(|e| e.to_string())?;
    Ok(data)
}

/// Makes this thread's file-system identity `account`'s: its groups, then its gid and uid for
/// file access (Linux keeps credentials per thread; the raw system calls, unlike glibc's
/// wrappers, change this thread alone). Checked afterwards: a thread that could not switch
/// reads nothing.
pub fn become_for_files(account: &identity::Account) -> std::io::Result<()> {
    if !identity::is_root() {
        return Ok(());
    }
    // SAFETY: plain system calls on this thread's credentials with values owned above.
    unsafe {
        if libc::syscall(libc::SYS_setgroups, account.groups.len(), account.groups.as_ptr()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        libc::syscall(libc::SYS_setfsgid, account.gid);
        libc::syscall(libc::SYS_setfsuid, account.uid);
        // Each returns the previous value: asking again with an impossible id reads it back.
        let fsgid = libc::syscall(libc::SYS_setfsgid, u32::MAX) as u32;
        let fsuid = libc::syscall(libc::SYS_setfsuid, u32::MAX) as u32;
        if fsuid != account.uid || fsgid != account.gid {
            return Err(std::io::Error::other(format!(
                "file-system identity is uid {fsuid} gid {fsgid}, not uid {} gid {}",
                account.uid, account.gid
            )));
        }
    }
    Ok(())
}

/// The `cgroup.procs` files a child joins, as C strings made before the fork.
pub(crate) fn cgroup_files(paths: &[std::path::PathBuf]) -> std::io::Result<Vec<std::ffi::CString>> {
    paths
        .iter()
        .map(|p| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).map_err(std::io::Error::other))
        .collect()
}

/// Between fork and exec: the child joins each cgroup (async-signal-safe calls only).
pub(crate) fn join_cgroups(procs: &[std::ffi::CString]) -> std::io::Result<()> {
    for p in procs {
        // SAFETY: open, write and close on a C string made before the fork.
        unsafe {
            let fd = libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                return Err(std::io::Error::last_os_error());
            }
            libc::close(fd);
        }
    }
    Ok(())
}

/// Between fork and exec: the child becomes (uid, gid, supplementary groups).
pub(crate) fn become_ids((uid, gid, groups): &(u32, u32, Vec<u32>)) -> std::io::Result<()> {
    // SAFETY: setgroups, setgid and setuid on memory made before the fork.
    unsafe {
        if libc::setgroups(groups.len(), groups.as_ptr()) != 0 || libc::setgid(*gid) != 0 || libc::setuid(*uid) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
