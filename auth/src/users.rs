//! The system's user database (files, LDAP, whatever NSS says), as the controller maps an
//! authenticated uid to a user name and the leader a job's user back to the uid it signs.

use std::ffi::{CStr, CString};

/// A user as the user database has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

/// Calls `f` with a buffer grown until what it looks up fits; `f` answers the return code of
/// a `get*_r` call and, on success, what it found (`None`: no such entry in `database`).
fn with_buffer<T>(what: &str, database: &str, f: impl Fn(&mut [u8]) -> (libc::c_int, Option<T>)) -> Result<T, String> {
    let mut buf = vec![0u8; 4096];
    loop {
        let (rc, found) = f(&mut buf);
        if rc == libc::ERANGE && buf.len() < 1 << 24 {
            buf.resize(buf.len() * 4, 0);
            continue;
        }
        if rc != 0 {
            return Err(format!("cannot look up {what}: {}", std::io::Error::from_raw_os_error(rc)));
        }
        return found.ok_or_else(|| format!("{what} is not in the {database} database"));
    }
}

/// Calls `f` (getpwuid_r or getpwnam_r) with a growing buffer.
fn getpw(
    what: &str,
    f: impl Fn(&mut libc::passwd, &mut [u8], &mut *mut libc::passwd) -> libc::c_int,
) -> Result<User, String> {
    with_buffer(what, "user", |buf| {
        // SAFETY: passwd is plain data; `f` fills it with pointers into `buf`, which outlives
        // every use of them here.
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        let rc = f(&mut pwd, buf, &mut result);
        let found = (!result.is_null() && !pwd.pw_name.is_null()).then(|| {
            // SAFETY: on success pw_name points at a NUL-terminated string in `buf`.
            let name = unsafe { CStr::from_ptr(pwd.pw_name) }.to_string_lossy().into_owned();
            User { name, uid: pwd.pw_uid, gid: pwd.pw_gid }
        });
        (rc, found)
    })
}

/// The longest user name a request may name (Linux allows 32; LDAP directories more).
pub const MAX_NAME_BYTES: usize = 256;

/// Checks a user name a request sends before it is looked up or stored: not empty, not longer
/// than [`MAX_NAME_BYTES`], no control characters, no NUL, no ':' (identities travel as
/// `user:uid:gid`).
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_NAME_BYTES {
        return Err(format!("a user name has 1 to {MAX_NAME_BYTES} bytes"));
    }
    if name.chars().any(|c| c.is_control() || c == ':') {
        return Err(format!("user name {name:?} contains a control character or ':'"));
    }
    Ok(())
}

/// The user with this uid.
pub fn by_uid(uid: u32) -> Result<User, String> {
    getpw(&format!("uid {uid}"), |pwd, buf, result| {
        // SAFETY: see getpw.
        unsafe { libc::getpwuid_r(uid, pwd, buf.as_mut_ptr().cast(), buf.len(), result) }
    })
}

/// The user with this name.
pub fn by_name(name: &str) -> Result<User, String> {
    let cname = CString::new(name).map_err(|_| format!("user name '{name}' contains a NUL byte"))?;
    getpw(&format!("user '{name}'"), |pwd, buf, result| {
        // SAFETY: see getpw.
        unsafe { libc::getpwnam_r(cname.as_ptr(), pwd, buf.as_mut_ptr().cast(), buf.len(), result) }
    })
}

/// Users by name, each looked up again after a minute: the leader signs a launch and a replica
/// checks a token's user without reading the user database each time.
#[derive(Default)]
pub struct Cache {
    by_name: std::sync::Mutex<std::collections::HashMap<String, (User, std::time::Instant)>>,
}

impl Cache {
    const FRESH: std::time::Duration = std::time::Duration::from_secs(60);
    /// Past this many names the cache starts again (a bound on what users can make it hold).
    const MOST: usize = 100_000;

    /// The user named `name`, as [`by_name`] says; a name not found is looked up every time.
    pub fn by_name(&self, name: &str) -> Result<User, String> {
        let mut cache = self.by_name.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((found, at)) = cache.get(name) {
            if at.elapsed() < Self::FRESH {
                return Ok(found.clone());
            }
        }
        let found = by_name(name)?;
        if cache.len() >= Self::MOST {
            cache.clear();
        }
        cache.insert(name.to_string(), (found.clone(), std::time::Instant::now()));
        Ok(found)
    }
}

/// A group as the group database has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    pub name: String,
    pub gid: u32,
}

/// Calls `f` (getgrgid_r or getgrnam_r) with a growing buffer.
fn getgr(
    what: &str,
    f: impl Fn(&mut libc::group, &mut [u8], &mut *mut libc::group) -> libc::c_int,
) -> Result<Group, String> {
    with_buffer(what, "group", |buf| {
        // SAFETY: group is plain data; `f` fills it with pointers into `buf`, which outlives
        // every use of them here.
        let mut grp: libc::group = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::group = std::ptr::null_mut();
        let rc = f(&mut grp, buf, &mut result);
        let found = (!result.is_null() && !grp.gr_name.is_null()).then(|| {
            // SAFETY: on success gr_name points at a NUL-terminated string in `buf`.
            let name = unsafe { CStr::from_ptr(grp.gr_name) }.to_string_lossy().into_owned();
            Group { name, gid: grp.gr_gid }
        });
        (rc, found)
    })
}

/// The group with this name, or, when `name_or_gid` is a number, with this gid (as Slurm's
/// `--gid` takes either).
pub fn group(name_or_gid: &str) -> Result<Group, String> {
    if let Ok(gid) = name_or_gid.parse::<u32>() {
        return getgr(&format!("gid {gid}"), |grp, buf, result| {
            // SAFETY: see getgr.
            unsafe { libc::getgrgid_r(gid, grp, buf.as_mut_ptr().cast(), buf.len(), result) }
        });
    }
    check_name(name_or_gid)?;
    let cname = CString::new(name_or_gid).map_err(|_| format!("group name '{name_or_gid}' contains a NUL byte"))?;
    getgr(&format!("group '{name_or_gid}'"), |grp, buf, result| {
        // SAFETY: see getgr.
        unsafe { libc::getgrnam_r(cname.as_ptr(), grp, buf.as_mut_ptr().cast(), buf.len(), result) }
    })
}

/// The user running this process.
pub fn current() -> Result<User, String> {
    // SAFETY: getuid cannot fail.
    by_uid(unsafe { libc::getuid() })
}

#[cfg(test)]
mod tests {
    #[test]
    fn user_names_a_request_sends_are_bounded() {
        assert!(super::check_name("alice").is_ok());
        assert!(super::check_name("").is_err());
        assert!(super::check_name(&"a".repeat(300)).is_err());
        assert!(super::check_name("a\u{1b}[2J").is_err());
        assert!(super::check_name("root:0:0").is_err());
    }

    #[test]
    fn groups_are_found_by_name_or_gid() {
        assert_eq!(super::group("root").unwrap(), super::Group { name: "root".into(), gid: 0 });
        assert_eq!(super::group("0").unwrap().name, "root");
        assert!(super::group("no-such-group-here").unwrap_err().contains("not in the group database"));
        assert!(super::group("a:b").is_err());
    }

    #[test]
    fn root_is_uid_0_both_ways() {
        assert_eq!(super::by_uid(0).unwrap().name, "root");
        assert_eq!(super::by_name("root").unwrap().uid, 0);
        assert!(super::by_name("no-such-user-here").unwrap_err().contains("not in the user database"));
    }
}
