//! The dev cluster's security, made on the spot: a CA, the certificates of its replicas and
//! agents, the launch and token keys (as `quorum admin certs` makes them), and a `munged` of its
//! own with a fresh key. `quorum dev` makes one in its data directory; the tests of one process
//! share one ([`DevSecurity::shared`]).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use quorum_auth::munge::{Daemon, Munge};
use quorum_auth::pki::{Layout, PeerRole};
use quorum_auth::tls::ClientTls;
use quorum_control::config::SecurityConfig;

impl std::fmt::Debug for DevSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DevSecurity({})", self.layout.dir.display())
    }
}

pub struct DevSecurity {
    layout: Layout,
    munged: Daemon,
    /// Issuing writes a certificate and its key: one at a time.
    issuing: Mutex<()>,
    _tmp: Option<tempfile::TempDir>,
}

impl DevSecurity {
    /// Makes (or reuses) the certificates in `dir/certs` and starts munged in `dir/munge`.
    /// Both directories, and `dir`, are traversable by other users, so that they can reach the
    /// CA certificate and the socket; keys are readable by their owner only.
    pub fn create(dir: &Path) -> anyhow::Result<DevSecurity> {
        Self::create_in(dir, None)
    }

    fn create_in(dir: &Path, tmp: Option<tempfile::TempDir>) -> anyhow::Result<DevSecurity> {
        use std::os::unix::fs::PermissionsExt;
        let traversable = |p: &Path| -> anyhow::Result<()> {
            std::fs::create_dir_all(p)?;
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o711))?;
            Ok(())
        };
        traversable(dir)?;
        let certs = dir.join("certs");
        traversable(&certs)?;
        let layout = Layout::new(&certs);
        layout.init()?;
        std::fs::set_permissions(layout.ca(), std::fs::Permissions::from_mode(0o644))?;
        let munged = Daemon::start(&dir.join("munge"))?;
        Ok(DevSecurity { layout, munged, issuing: Mutex::new(()), _tmp: tmp })
    }

    /// One for every test of this process (each test binary), in a temporary directory.
    pub fn shared() -> Arc<DevSecurity> {
        static SHARED: OnceLock<Arc<DevSecurity>> = OnceLock::new();
        SHARED
            .get_or_init(|| {
                let tmp = tempfile::Builder::new().prefix("quorum-security-").tempdir().expect("a temporary directory");
                let dir = tmp.path().to_path_buf();
                Arc::new(DevSecurity::create_in(&dir, Some(tmp)).expect("the tests' certificates and munged"))
            })
            .clone()
    }

    pub fn certs_dir(&self) -> &Path {
        &self.layout.dir
    }

    pub fn ca(&self) -> PathBuf {
        self.layout.ca()
    }

    pub fn munge_socket(&self) -> &Path {
        &self.munged.socket
    }

    /// Issues `role`'s certificate unless it exists.
    pub fn ensure(&self, role: &PeerRole) -> anyhow::Result<()> {
        let _one = self.issuing.lock().unwrap_or_else(|p| p.into_inner());
        let (cert, key) = self.layout.pair(role);
        if !(cert.exists() && key.exists()) {
            self.layout.issue(role, &[])?;
        }
        Ok(())
    }

    /// `[security]` of replica `id`.
    pub fn controller(&self, id: u64) -> anyhow::Result<SecurityConfig> {
        self.ensure(&PeerRole::Replica(id))?;
        Ok(SecurityConfig {
            certs_dir: Some(self.layout.dir.clone()),
            munge_socket: Some(self.munged.socket.clone()),
            ..SecurityConfig::default()
        })
    }

    /// The same as a TOML table, for configuration files.
    pub fn controller_toml(&self, id: u64) -> anyhow::Result<String> {
        Ok(format!("[security]\n{}", toml::to_string(&self.controller(id)?)?))
    }

    /// Gives agent `config` its node's certificate and the launch key.
    pub fn secure_agent(&self, config: &mut quorum_agent::AgentConfig) -> anyhow::Result<()> {
        self.ensure(&PeerRole::Agent(config.name.clone()))?;
        config.secure_with(&self.layout.dir)
    }

    /// How a client of this process (its user) reaches the cluster.
    pub fn client(&self) -> quorum_client::client::Security {
        quorum_client::client::Security {
            tls: Some(ClientTls::anonymous(&self.layout.ca()).expect("the dev CA certificate")),
            proof: quorum_client::client::Proof::Munge(
                Munge::new(Some(&self.munged.socket)).restrict_to(controllers_uid()),
            ),
        }
    }

    /// A token for `user`, minted with the cluster's token key as an admin's `quorum token --user`
    /// would: how tests act as other users without running as them.
    pub fn token_for(&self, user: &str) -> String {
        let tokens = quorum_auth::token::Tokens::load(&[self.layout.token_key()]).expect("the token key");
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        tokens.mint(user, now, 3600)
    }

    /// The environment a `quorum` command needs for this cluster, besides QUORUM_CONTROLLERS.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![
            ("QUORUM_CA", self.layout.ca().display().to_string()),
            ("QUORUM_MUNGE_SOCKET", self.munged.socket.display().to_string()),
        ];
        // Credentials are made for the controllers' uid alone: root's unless said otherwise.
        if controllers_uid() != 0 {
            env.push(("QUORUM_CONTROLLER_USER", controllers_uid().to_string()));
        }
        env
    }
}

/// The uid a dev cluster's controllers run as: this process's.
pub fn controllers_uid() -> u32 {
    // SAFETY: geteuid has no failure mode.
    unsafe { libc::geteuid() }
}

/// For a cluster with `insecure = true`: plaintext, and this process's user named, not proved.
pub fn claimed() -> anyhow::Result<quorum_client::client::Security> {
    let me = quorum_auth::users::current().map_err(anyhow::Error::msg)?;
    Ok(quorum_client::client::Security {
        tls: None,
        proof: quorum_client::client::Proof::Claim(format!("{}:{}:{}", me.name, me.uid, me.gid)),
    })
}
