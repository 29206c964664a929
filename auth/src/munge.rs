//! MUNGE credentials through libmunge (Debian's `libmunge2`), as every Slurm site runs them: the
//! client asks its host's `munged` for a credential that carries its uid and gid, and the
//! controller asks its own `munged` (same key) to decode it. `munged` refuses a credential that
//! expired, was decoded before (replay), or was encoded with another key.
//!
//! Other services on the same hosts share the key, so a credential proves only who made it, not
//! for what. A credential counts for Quorum only when it was made for Quorum ([`Munge::credential`],
//! [`Munge::check_for_quorum`]): sealed with Quorum's payload ([`QUORUM_PAYLOAD`]), and
//! restricted to the controllers' uid, so that only they can decode it (as Slurm's auth/munge
//! restricts its credentials to SlurmUser). One that a user made for another service cannot
//! be relayed to the controllers, nor one made for the controllers decoded by anyone else.

use std::ffi::{CStr, CString};
use std::os::raw::{c_char, c_int, c_void};
use std::path::{Path, PathBuf};

#[allow(non_camel_case_types)]
type munge_ctx_t = *mut c_void;

/// `munge_opt_t`: the socket to reach `munged` on.
const MUNGE_OPT_SOCKET: c_int = 8;
/// `munge_opt_t`: the one uid that may decode a credential (`uid_t`).
const MUNGE_OPT_UID_RESTRICTION: c_int = 9;
/// libmunge's `MUNGE_UID_ANY`: no restriction.
const MUNGE_UID_ANY: libc::uid_t = libc::uid_t::MAX;

/// What a credential made for Quorum carries: its purpose (the controllers' API) and the version
/// of this form. A credential with any other payload was made for something else.
pub const QUORUM_PAYLOAD: &[u8] = b"quorum/1 purpose=api";

#[link(name = "munge")]
extern "C" {
    fn munge_encode(cred: *mut *mut c_char, ctx: munge_ctx_t, buf: *const c_void, len: c_int) -> c_int;
    fn munge_decode(
        cred: *const c_char,
        ctx: munge_ctx_t,
        buf: *mut *mut c_void,
        len: *mut c_int,
        uid: *mut libc::uid_t,
        gid: *mut libc::gid_t,
    ) -> c_int;
    fn munge_ctx_create() -> munge_ctx_t;
    fn munge_ctx_destroy(ctx: munge_ctx_t);
    fn munge_ctx_set(ctx: munge_ctx_t, opt: c_int, ...) -> c_int;
    fn munge_ctx_get(ctx: munge_ctx_t, opt: c_int, ...) -> c_int;
    fn munge_strerror(e: c_int) -> *const c_char;
}

/// Why a credential could not be made or was refused, with `munged`'s own words.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MungeError {
    #[error("expired MUNGE credential")]
    Expired,
    #[error("replayed MUNGE credential (it was used before)")]
    Replayed,
    #[error("MUNGE credential from the future (rewound clock)")]
    Rewound,
    #[error("invalid MUNGE credential (forged, damaged, or made with another key)")]
    Invalid,
    #[error("MUNGE credential not made for Quorum: {0}")]
    NotForQuorum(String),
    #[error("cannot reach munged at {socket}: {message}")]
    Daemon { socket: String, message: String },
    #[error("MUNGE: {0}")]
    Other(String),
}

/// libmunge's error numbers (munge.h) that name a bad credential rather than a bad daemon.
fn error(code: c_int, socket: &str) -> MungeError {
    match code {
        15 => MungeError::Expired,
        16 => MungeError::Rewound,
        17 => MungeError::Replayed,
        14 | 18 | 8 | 9 | 10 | 11 | 12 | 13 => MungeError::Invalid,
        // EMUNGE_SOCKET, EMUNGE_TIMEOUT
        6 | 7 => MungeError::Daemon { socket: socket.to_string(), message: strerror(code) },
        _ => MungeError::Other(strerror(code)),
    }
}

fn strerror(code: c_int) -> String {
    // SAFETY: munge_strerror returns a static string for any code.
    let p = unsafe { munge_strerror(code) };
    if p.is_null() {
        format!("error {code}")
    } else {
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// The socket of the host's `munged`, when not the default, and the one uid that may decode the
/// credentials made here, when restricted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Munge {
    socket: Option<PathBuf>,
    restrict_to: Option<u32>,
}

/// What a valid credential says of its maker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decoded {
    pub uid: u32,
    pub gid: u32,
    /// The one uid that may decode it, if its maker restricted it.
    pub restricted_to: Option<u32>,
}

/// A libmunge context, destroyed on drop.
struct Ctx(munge_ctx_t);

impl Drop for Ctx {
    fn drop(&mut self) {
        // SAFETY: created by munge_ctx_create, destroyed once.
        unsafe { munge_ctx_destroy(self.0) }
    }
}

impl Munge {
    /// `munged` at `socket`, or at libmunge's default (`/run/munge/munge.socket.2`).
    pub fn new(socket: Option<&Path>) -> Munge {
        Munge { socket: socket.map(Path::to_path_buf), restrict_to: None }
    }

    /// The credentials made here may be decoded by `uid` alone (the controllers').
    pub fn restrict_to(mut self, uid: u32) -> Munge {
        self.restrict_to = Some(uid);
        self
    }

    /// A credential for the controllers: Quorum's payload, restricted to the controllers' uid
    /// (set with [`Munge::restrict_to`]).
    pub fn credential(&self) -> Result<String, MungeError> {
        if self.restrict_to.is_none() {
            return Err(MungeError::Other("no controller uid to restrict the credential to".into()));
        }
        self.encode(QUORUM_PAYLOAD)
    }

    /// Checks that a credential decoded by this process (its effective uid `me`) was made for
    /// Quorum: its payload, and its restriction to `me`.
    pub fn check_for_quorum(decoded: &Decoded, payload: &[u8], me: u32) -> Result<(), MungeError> {
        if payload != QUORUM_PAYLOAD {
            return Err(MungeError::NotForQuorum(
                "its payload is not Quorum's (it was made for another service, or by an older client)".into(),
            ));
        }
        match decoded.restricted_to {
            Some(uid) if uid == me => Ok(()),
            Some(uid) => {
                Err(MungeError::NotForQuorum(format!("it is restricted to uid {uid}, not the controllers' {me}")))
            }
            None => Err(MungeError::NotForQuorum(format!("it is not restricted to the controllers' uid {me}"))),
        }
    }

    fn socket_name(&self) -> String {
        self.socket.as_ref().map_or_else(|| "the default socket".into(), |s| s.display().to_string())
    }

    fn ctx(&self) -> Result<Ctx, MungeError> {
        // SAFETY: plain constructor; a null context means out of memory.
        let ctx = unsafe { munge_ctx_create() };
        if ctx.is_null() {
            return Err(MungeError::Other("cannot create a MUNGE context".into()));
        }
        let ctx = Ctx(ctx);
        if let Some(socket) = &self.socket {
            let path = CString::new(socket.as_os_str().as_encoded_bytes())
                .map_err(|_| MungeError::Other("the MUNGE socket path contains a NUL byte".into()))?;
            // SAFETY: MUNGE_OPT_SOCKET takes a NUL-terminated string, which libmunge copies.
            let rc = unsafe { munge_ctx_set(ctx.0, MUNGE_OPT_SOCKET, path.as_ptr()) };
            if rc != 0 {
                return Err(error(rc, &self.socket_name()));
            }
        }
        Ok(ctx)
    }

    /// A fresh credential for the calling process's uid and gid, with `payload` sealed in it.
    pub fn encode(&self, payload: &[u8]) -> Result<String, MungeError> {
        let ctx = self.ctx()?;
        let len = c_int::try_from(payload.len()).map_err(|_| MungeError::Other("payload too large".into()))?;
        if let Some(uid) = self.restrict_to {
            // SAFETY: MUNGE_OPT_UID_RESTRICTION takes a uid_t by value.
            let rc = unsafe { munge_ctx_set(ctx.0, MUNGE_OPT_UID_RESTRICTION, uid as libc::uid_t) };
            if rc != 0 {
                return Err(error(rc, &self.socket_name()));
            }
        }
        let mut cred: *mut c_char = std::ptr::null_mut();
        // SAFETY: libmunge reads `len` bytes of `payload` and mallocs the credential string.
        let rc = unsafe { munge_encode(&mut cred, ctx.0, payload.as_ptr().cast(), len) };
        if rc != 0 {
            return Err(error(rc, &self.socket_name()));
        }
        // SAFETY: on success `cred` is a NUL-terminated malloc'ed string we own.
        let text = unsafe { CStr::from_ptr(cred) }.to_string_lossy().into_owned();
        unsafe { libc::free(cred.cast()) };
        Ok(text)
    }

    /// Checks `cred` with `munged`: who made it, and its payload. Each credential decodes once.
    pub fn decode(&self, cred: &str) -> Result<(Decoded, Vec<u8>), MungeError> {
        let ctx = self.ctx()?;
        let cred = CString::new(cred).map_err(|_| MungeError::Invalid)?;
        let mut buf: *mut c_void = std::ptr::null_mut();
        let mut len: c_int = 0;
        let (mut uid, mut gid): (libc::uid_t, libc::gid_t) = (0, 0);
        // SAFETY: libmunge mallocs the payload into `buf` (also on some errors), which we free.
        let rc = unsafe { munge_decode(cred.as_ptr(), ctx.0, &mut buf, &mut len, &mut uid, &mut gid) };
        let payload = if buf.is_null() {
            Vec::new()
        } else {
            // SAFETY: `buf` holds `len` bytes.
            let v = unsafe { std::slice::from_raw_parts(buf as *const u8, len.max(0) as usize) }.to_vec();
            unsafe { libc::free(buf) };
            v
        };
        if rc != 0 {
            return Err(error(rc, &self.socket_name()));
        }
        // After a decode the context holds the credential's own options, its restriction among them.
        let mut restriction: libc::uid_t = MUNGE_UID_ANY;
        // SAFETY: MUNGE_OPT_UID_RESTRICTION writes one uid_t through the pointer.
        let rc = unsafe { munge_ctx_get(ctx.0, MUNGE_OPT_UID_RESTRICTION, &mut restriction as *mut libc::uid_t) };
        if rc != 0 {
            return Err(error(rc, &self.socket_name()));
        }
        let restricted_to = (restriction != MUNGE_UID_ANY).then_some(restriction);
        Ok((Decoded { uid, gid, restricted_to }, payload))
    }
}

/// A `munged` of our own (for `quorum dev` and tests): a fresh key and its socket in `dir`,
/// run in the foreground as our child. It is stopped when the [`Daemon`] drops, and by the
/// kernel when this process dies (it is started from a thread that never exits, with
/// PR_SET_PDEATHSIG), so none is left behind. The directory is made traversable by other users,
/// so that they can reach the socket.
pub struct Daemon {
    pub socket: PathBuf,
    child: std::sync::Mutex<std::process::Child>,
}

impl Daemon {
    pub fn start(dir: &Path) -> anyhow::Result<Daemon> {
        use std::os::unix::fs::PermissionsExt;
        use std::os::unix::process::CommandExt;
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))?;
        let key = dir.join("munge.key");
        if !key.exists() {
            let mut bytes = [0u8; 1024];
            ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
                .map_err(|_| anyhow::anyhow!("no randomness for a MUNGE key"))?;
            std::fs::write(&key, bytes)?;
        }
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))?;
        let socket = dir.join("munge.socket");
        let _ = std::fs::remove_file(&socket);
        let mut command = std::process::Command::new(munged_binary());
        command
            .arg("--foreground")
            .arg("--force")
            .arg(format!("--socket={}", socket.display()))
            .arg(format!("--key-file={}", key.display()))
            .arg(format!("--pid-file={}", dir.join("munged.pid").display()))
            .arg(format!("--log-file={}", dir.join("munged.log").display()))
            .arg(format!("--seed-file={}", dir.join("munged.seed").display()))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        // SAFETY: prctl is async-signal-safe; it runs in the child between fork and exec.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new().name("munged-parent".into()).spawn(move || {
            let _ = tx.send(command.spawn());
            // The death signal follows the thread that forked: this one lives as long as the
            // process does.
            loop {
                std::thread::park();
            }
        })?;
        let mut child = rx.recv()?.map_err(|e| {
            anyhow::anyhow!("starting munged: {e} (install Debian's `munge` package: apt-get install munge)")
        })?;
        let started = std::time::Instant::now();
        while !socket.exists() {
            if let Some(status) = child.try_wait()? {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                anyhow::bail!(
                    "munged exited ({status}): {err}{}",
                    std::fs::read_to_string(dir.join("munged.log")).unwrap_or_default()
                );
            }
            if started.elapsed() > std::time::Duration::from_secs(10) {
                let _ = child.kill();
                anyhow::bail!("munged did not create its socket {} within 10s", socket.display());
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        Ok(Daemon { socket, child: std::sync::Mutex::new(child) })
    }
}

fn munged_binary() -> PathBuf {
    ["/usr/sbin/munged", "/sbin/munged"].iter().map(PathBuf::from).find(|p| p.exists()).unwrap_or("munged".into())
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: kill(2) of our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let _ = child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_decodes_once_to_its_makers_uid_and_not_with_another_key() {
        let dir = tempfile::tempdir().unwrap();
        let daemon = Daemon::start(dir.path()).unwrap();
        let munge = Munge::new(Some(&daemon.socket));
        let cred = munge.encode(b"hello").unwrap();
        let (who, payload) = munge.decode(&cred).unwrap();
        assert_eq!(who.uid, unsafe { libc::getuid() });
        assert_eq!(payload, b"hello");
        assert_eq!(munge.decode(&cred).unwrap_err(), MungeError::Replayed);

        let other_dir = tempfile::tempdir().unwrap();
        let other = Daemon::start(other_dir.path()).unwrap();
        let foreign = Munge::new(Some(&other.socket)).encode(b"").unwrap();
        assert_eq!(munge.decode(&foreign).unwrap_err(), MungeError::Invalid);
        let mut forged = munge.encode(b"").unwrap();
        forged.replace_range(20..24, "AAAA");
        assert!(munge.decode(&forged).is_err());

        let gone = Munge::new(Some(&dir.path().join("nothing")));
        assert!(matches!(gone.encode(b"").unwrap_err(), MungeError::Daemon { .. }));
    }

    #[test]
    fn only_a_credential_made_for_quorum_and_restricted_to_the_controllers_counts() {
        let dir = tempfile::tempdir().unwrap();
        let daemon = Daemon::start(dir.path()).unwrap();
        // SAFETY: geteuid has no failure mode.
        let me = unsafe { libc::geteuid() };
        let munge = Munge::new(Some(&daemon.socket));
        let ours = munge.clone().restrict_to(me);
        let (who, payload) = munge.decode(&ours.credential().unwrap()).unwrap();
        assert_eq!(who.restricted_to, Some(me));
        Munge::check_for_quorum(&who, &payload, me).unwrap();
        // Another service's credential (its own payload, or none, unrestricted): refused.
        for (cred, why) in [
            (munge.encode(b"").unwrap(), "payload"),
            (munge.encode(b"someservice").unwrap(), "payload"),
            (munge.encode(QUORUM_PAYLOAD).unwrap(), "not restricted"),
        ] {
            let (who, payload) = munge.decode(&cred).unwrap();
            let err = Munge::check_for_quorum(&who, &payload, me).unwrap_err();
            assert!(err.to_string().contains(why), "{err}");
        }
        // Quorum's payload restricted to another uid: munged itself refuses to decode it here
        // unless this is root, and the check refuses it either way.
        let other = if me == 0 { 4242 } else { 0 };
        let foreign = munge.clone().restrict_to(other).credential().unwrap();
        match munge.decode(&foreign) {
            Ok((who, payload)) => {
                assert_eq!(who.restricted_to, Some(other));
                assert!(Munge::check_for_quorum(&who, &payload, me).is_err());
            }
            Err(e) => assert_eq!(e, MungeError::Invalid),
        }
        assert!(munge.credential().is_err(), "no credential without a uid to restrict it to");
    }
}
