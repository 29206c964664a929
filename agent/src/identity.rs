//! Who a job runs as. An agent running as root runs each job as the user who submitted it (the
//! user's uid, primary gid, supplementary groups and home, from the node's user database), never
//! as root unless that user is root; an agent running as anyone else runs only that user's jobs.

use std::ffi::{CStr, CString};

/// A user account on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// Every group the user is in, the primary one included.
    pub groups: Vec<u32>,
    pub home: String,
    pub shell: String,
}

/// Looks a user up by name in the node's user database (files, LDAP, whatever NSS says).
pub fn lookup(name: &str) -> Result<Account, String> {
    let cname = CString::new(name).map_err(|_| format!("user name '{name}' contains a NUL byte"))?;
    let mut buf = vec![0u8; 4096];
    loop {
        // SAFETY: passwd is plain data; getpwnam_r fills it with pointers into `buf`, which
        // outlives every use of them below.
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        let rc = unsafe { libc::getpwnam_r(cname.as_ptr(), &mut pwd, buf.as_mut_ptr().cast(), buf.len(), &mut result) };
        if rc == libc::ERANGE && buf.len() < 1 << 20 {
            buf.resize(buf.len() * 4, 0);
            continue;
        }
        if rc != 0 {
            return Err(format!("cannot look up user '{name}': {}", std::io::Error::from_raw_os_error(rc)));
        }
        if result.is_null() {
            return Err(format!("user '{name}' does not exist on this node"));
        }
        // SAFETY: on success the string fields point at NUL-terminated strings in `buf`.
        let text = |p: *const libc::c_char| {
            if p.is_null() {
                String::new()
            } else {
                unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
            }
        };
        let (uid, gid) = (pwd.pw_uid, pwd.pw_gid);
        return Ok(Account {
            name: name.to_string(),
            uid,
            gid,
            groups: group_list(&cname, gid),
            home: text(pwd.pw_dir),
            shell: text(pwd.pw_shell),
        });
    }
}

/// The user's groups by getgrouplist(3), always including `gid`.
fn group_list(name: &CStr, gid: u32) -> Vec<u32> {
    let mut n: libc::c_int = 32;
    loop {
        let mut groups = vec![0 as libc::gid_t; n as usize];
        let mut count = n;
        // SAFETY: getgrouplist writes at most `count` entries into `groups` and sets `count`.
        let rc = unsafe { libc::getgrouplist(name.as_ptr(), gid, groups.as_mut_ptr(), &mut count) };
        if rc >= 0 {
            groups.truncate(count.max(0) as usize);
            if !groups.contains(&gid) {
                groups.push(gid);
            }
            return groups;
        }
        if count <= n || n > 65536 {
            return vec![gid];
        }
        n = count;
    }
}

/// Who a job of `user` runs as: that user when the agent switches users (and can, as root).
/// An agent that cannot or does not switch users runs only its own user's jobs: it never runs
/// one user's job as another, root included.
pub fn job_account(switch_user: bool, user: &str) -> Result<Option<Account>, String> {
    if !is_root() {
        // It cannot switch users: it runs its own user's jobs only, never another's as itself.
        static ME: std::sync::OnceLock<Result<String, String>> = std::sync::OnceLock::new();
        let me = ME.get_or_init(|| quorum_auth::users::current().map(|u| u.name));
        return match me {
            Ok(me) if me == user => Ok(None),
            Ok(me) => {
                Err(format!("this agent runs as '{me}' and cannot switch users: it runs no job of user '{user}'"))
            }
            Err(e) => Err(e.clone()),
        };
    }
    if !switch_user {
        if user == "root" {
            return Ok(None);
        }
        return Err(format!(
            "this agent runs as root without switching users: it does not run user '{user}''s job as root"
        ));
    }
    lookup(user).map(Some)
}

/// `account` with `group` (a group's name, from `sbatch --gid`; empty: none) as its primary
/// group, looked up on this node; the user's own groups stay its supplementary ones.
pub fn with_group(account: Option<Account>, group: &str) -> Result<Option<Account>, String> {
    if group.is_empty() {
        return Ok(account);
    }
    let Some(mut a) = account else {
        return Err(format!("this agent does not switch users: it cannot run a job with --gid {group}"));
    };
    let g = quorum_auth::users::group(group).map_err(|e| format!("--gid {group}: {e} on this node"))?;
    a.gid = g.gid;
    if !a.groups.contains(&g.gid) {
        a.groups.push(g.gid);
    }
    Ok(Some(a))
}

/// Whether this process may run jobs as other users.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no failure mode and touches no memory.
    unsafe { libc::geteuid() == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_and_unknown_users() {
        let root = lookup("root").unwrap();
        assert_eq!((root.uid, root.gid), (0, 0));
        assert!(root.groups.contains(&0));
        assert_eq!(root.home, "/root");
        let err = lookup("no-such-user-here").unwrap_err();
        assert_eq!(err, "user 'no-such-user-here' does not exist on this node");
    }

    #[test]
    fn a_group_given_becomes_the_primary_one_and_the_users_groups_stay() {
        let root = lookup("root").unwrap();
        let other = quorum_auth::users::group("1").unwrap();
        let a = with_group(Some(root.clone()), &other.name).unwrap().unwrap();
        assert_eq!((a.uid, a.gid), (0, 1));
        assert!(a.groups.contains(&0) && a.groups.contains(&1), "{:?}", a.groups);
        assert_eq!(with_group(Some(root.clone()), "").unwrap(), Some(root.clone()), "none given");
        assert!(with_group(None, &other.name).unwrap_err().contains("does not switch users"));
        assert!(with_group(Some(root), "no-such-group-here").unwrap_err().contains("not in the group database"));
    }
}
