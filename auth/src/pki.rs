//! The cluster's keys and certificates (`quorum admin certs`), as files in one directory:
//!
//! | file | who holds it |
//! |---|---|
//! | `ca.pem` | everyone: clients verify the controllers with it |
//! | `ca.key` | the operator only: it issues certificates |
//! | `replica-<id>.pem`, `.key` | controller `<id>` |
//! | `agent-<node>.pem`, `.key` | the agent of `<node>` |
//! | `client-<name>.pem`, `.key` | a tool that may present a certificate (it authenticates nothing) |
//! | `launch.key` | the controllers: they sign launches with it |
//! | `launch.pub` | the agents: they verify launches with it |
//! | `token.key` | the controllers: they sign and verify tokens with it |
//!
//! What a certificate is for is written in it, as a URI name: `quorum:replica:<id>`,
//! `quorum:agent:<node>` or `quorum:client:<name>`. Controllers' certificates also carry the
//! DNS name [`CONTROLLER_NAME`], which clients verify, and the hosts they are reached at.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    SanType,
};
use ring::rand::SecureRandom;

/// The DNS name every controller certificate carries and every client verifies.
pub const CONTROLLER_NAME: &str = "quorum-controller";

/// What a certificate of the cluster says its holder is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PeerRole {
    Replica(u64),
    Agent(String),
    Client(String),
}

impl PeerRole {
    fn uri(&self) -> String {
        match self {
            PeerRole::Replica(id) => format!("quorum:replica:{id}"),
            PeerRole::Agent(node) => format!("quorum:agent:{node}"),
            PeerRole::Client(name) => format!("quorum:client:{name}"),
        }
    }

    /// Reads a `quorum:` URI name.
    pub fn from_uri(uri: &str) -> Option<PeerRole> {
        let rest = uri.strip_prefix("quorum:")?;
        let (kind, name) = rest.split_once(':')?;
        if name.is_empty() {
            return None;
        }
        match kind {
            "replica" => name.parse().ok().map(PeerRole::Replica),
            "agent" => Some(PeerRole::Agent(name.to_string())),
            "client" => Some(PeerRole::Client(name.to_string())),
            _ => None,
        }
    }

    /// The role a DER certificate names, if any (the chain was verified by TLS already).
    pub fn of_certificate(der: &[u8]) -> Option<PeerRole> {
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let san = cert.subject_alternative_name().ok()??;
        san.value.general_names.iter().find_map(|n| match n {
            x509_parser::extensions::GeneralName::URI(uri) => PeerRole::from_uri(uri),
            _ => None,
        })
    }
}

/// File names in a certificates directory.
pub struct Layout {
    pub dir: PathBuf,
}

impl Layout {
    pub fn new(dir: impl Into<PathBuf>) -> Layout {
        Layout { dir: dir.into() }
    }
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }
    pub fn ca_key(&self) -> PathBuf {
        self.dir.join("ca.key")
    }
    pub fn launch_key(&self) -> PathBuf {
        self.dir.join("launch.key")
    }
    pub fn launch_pub(&self) -> PathBuf {
        self.dir.join("launch.pub")
    }
    pub fn token_key(&self) -> PathBuf {
        self.dir.join("token.key")
    }
    /// The certificate and key files of `role`.
    pub fn pair(&self, role: &PeerRole) -> (PathBuf, PathBuf) {
        let stem = match role {
            PeerRole::Replica(id) => format!("replica-{id}"),
            PeerRole::Agent(node) => format!("agent-{node}"),
            PeerRole::Client(name) => format!("client-{name}"),
        };
        (self.dir.join(format!("{stem}.pem")), self.dir.join(format!("{stem}.key")))
    }
}

fn write_private(path: &Path, contents: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
    f.write_all(contents)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

fn write_public(path: &Path, contents: &[u8]) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

fn valid_name(kind: &str, name: &str) -> anyhow::Result<()> {
    if name.is_empty()
        || name.len() > 64
        || !name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        anyhow::bail!("invalid {kind} name '{name}': letters, digits, '-', '_' and '.' only, at most 64");
    }
    Ok(())
}

impl Layout {
    /// Makes what the cluster needs once (the CA, the launch and token keys); what exists is
    /// kept, so that running it again only adds certificates.
    pub fn init(&self) -> anyhow::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        if !self.ca().exists() || !self.ca_key().exists() {
            let key = KeyPair::generate()?;
            let mut params = CertificateParams::new(Vec::<String>::new())?;
            let mut serial = [0u8; 8];
            ring::rand::SystemRandom::new().fill(&mut serial).map_err(|_| anyhow::anyhow!("no randomness"))?;
            params.distinguished_name.push(DnType::CommonName, format!("Quorum cluster CA {}", hex(&serial)));
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
            params.not_after = rcgen::date_time_ymd(2100, 1, 1);
            let cert = params.self_signed(&key)?;
            write_private(&self.ca_key(), key.serialize_pem().as_bytes())?;
            write_public(&self.ca(), cert.pem().as_bytes())?;
        }
        if !self.launch_key().exists() {
            let rng = ring::rand::SystemRandom::new();
            let pkcs8 = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng)
                .map_err(|_| anyhow::anyhow!("cannot make a launch key"))?;
            write_private(&self.launch_key(), pkcs8.as_ref())?;
        }
        let pkcs8 = std::fs::read(self.launch_key())?;
        let pair = ring::signature::Ed25519KeyPair::from_pkcs8(&pkcs8)
            .map_err(|e| anyhow::anyhow!("{} is not an Ed25519 key: {e}", self.launch_key().display()))?;
        write_public(
            &self.launch_pub(),
            public_key_text(ring::signature::KeyPair::public_key(&pair).as_ref()).as_bytes(),
        )?;
        if !self.token_key().exists() {
            let mut secret = [0u8; 32];
            ring::rand::SystemRandom::new().fill(&mut secret).map_err(|_| anyhow::anyhow!("no randomness"))?;
            write_private(&self.token_key(), hex(&secret).as_bytes())?;
        }
        Ok(())
    }

    /// Issues (or re-issues) the certificate of `role`, signed by the CA. `hosts`: further DNS
    /// names or IP addresses it is reached at (controllers).
    pub fn issue(&self, role: &PeerRole, hosts: &[String]) -> anyhow::Result<(PathBuf, PathBuf)> {
        match role {
            PeerRole::Replica(_) => {}
            PeerRole::Agent(n) => valid_name("node", n)?,
            PeerRole::Client(n) => valid_name("client", n)?,
        }
        let ca_key = KeyPair::from_pem(&std::fs::read_to_string(self.ca_key()).map_err(|e| {
            anyhow::anyhow!("reading the CA key {}: {e} (run `quorum admin certs init` first)", self.ca_key().display())
        })?)?;
        let issuer = Issuer::from_ca_cert_pem(&std::fs::read_to_string(self.ca())?, ca_key)?;
        let mut names: Vec<String> = Vec::new();
        match role {
            PeerRole::Replica(_) => {
                names.extend([CONTROLLER_NAME.to_string(), "localhost".into(), "127.0.0.1".into(), "::1".into()]);
            }
            PeerRole::Agent(node) => names.push(node.clone()),
            PeerRole::Client(_) => {}
        }
        names.extend(hosts.iter().map(|h| h.rsplit_once(':').map_or(h.as_str(), |(host, _)| host).to_string()));
        names.sort();
        names.dedup();
        let mut params = CertificateParams::new(names)?;
        params.subject_alt_names.push(SanType::URI(role.uri().try_into()?));
        params.distinguished_name.push(DnType::CommonName, role.uri());
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.not_after = rcgen::date_time_ymd(2100, 1, 1);
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &issuer)?;
        let (cert_path, key_path) = self.pair(role);
        write_private(&key_path, key.serialize_pem().as_bytes())?;
        write_public(&cert_path, cert.pem().as_bytes())?;
        Ok((cert_path, key_path))
    }
}

/// An Ed25519 public key as `launch.pub` holds it.
pub fn public_key_text(key: &[u8]) -> String {
    use base64::Engine;
    format!("{}\n", base64::engine::general_purpose::STANDARD.encode(key))
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_certificates_name_their_role() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path());
        layout.init().unwrap();
        for role in [PeerRole::Replica(2), PeerRole::Agent("node01".into()), PeerRole::Client("ci".into())] {
            let (cert, _) = layout.issue(&role, &[]).unwrap();
            use rustls_pki_types::pem::PemObject;
            let der = rustls_pki_types::CertificateDer::from_pem_file(&cert).unwrap();
            assert_eq!(PeerRole::of_certificate(&der), Some(role));
        }
        assert!(layout.issue(&PeerRole::Agent("../etc".into()), &[]).is_err());
        assert_eq!(PeerRole::from_uri("quorum:replica:x"), None);
        assert_eq!(PeerRole::from_uri("quorum:agent:"), None);
    }
}
