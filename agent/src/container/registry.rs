//! Talking to a registry for a user: their credentials (enroot's `.credentials`, read as them),
//! a client of theirs (the OCI client keeps what a registry accepted per registry, so a client is
//! never shared between users or credentials), and errors said the way a user can act on them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::secrets::RegistryAuth;
use quorum_model::container::ImageRef;

use crate::identity::Account;

/// The largest credentials file read.
const MAX_CREDENTIALS: u64 = 64 * 1024;

/// A login for a registry, from a netrc-style file: `machine HOST login USER password PASS`.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Login {
    pub user: String,
    pub password: String,
}

impl std::fmt::Debug for Login {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Login({}, <password>)", self.user)
    }
}

/// The entry of `text` (netrc syntax, as enroot's `.credentials`) for `registry`, with `user`'s
/// login when one is named (`USER@` in the image).
pub fn find_login(text: &str, registry: &str, user: Option<&str>) -> Option<Login> {
    let mut words = text.split_whitespace();
    let mut found: Vec<(String, Login)> = Vec::new();
    let mut machine: Option<String> = None;
    let mut login = None;
    let mut password = None;
    let mut flush = |machine: &mut Option<String>, login: &mut Option<String>, password: &mut Option<String>| {
        if let (Some(m), Some(l), Some(p)) = (machine.take(), login.take(), password.take()) {
            found.push((m, Login { user: l, password: p }));
        }
        *login = None;
        *password = None;
    };
    while let Some(w) = words.next() {
        match w {
            "machine" => {
                flush(&mut machine, &mut login, &mut password);
                machine = words.next().map(str::to_string);
            }
            "default" => {
                flush(&mut machine, &mut login, &mut password);
                machine = Some(String::new());
            }
            "login" => login = words.next().map(str::to_string),
            "password" => password = words.next().map(str::to_string),
            _ => {}
        }
    }
    flush(&mut machine, &mut login, &mut password);
    let docker = registry.ends_with("docker.io");
    let host_matches =
        |m: &str| m == registry || (docker && matches!(m, "docker.io" | "index.docker.io" | "registry-1.docker.io"));
    let wanted = |l: &Login| user.is_none_or(|u| u == l.user);
    found
        .iter()
        .find(|(m, l)| host_matches(m) && wanted(l))
        .or_else(|| found.iter().find(|(m, l)| m.is_empty() && wanted(l)))
        .map(|(_, l)| l.clone())
}

/// Where enroot keeps a user's credentials: `$ENROOT_CONFIG_PATH/.credentials`, else
/// `$XDG_CONFIG_HOME/enroot/.credentials`, else `~/.config/enroot/.credentials`, with the job's
/// environment.
pub fn credentials_path(env: &[(String, String)], home: &str) -> PathBuf {
    let var = |k: &str| env.iter().find(|(n, v)| n == k && !v.is_empty()).map(|(_, v)| v.clone());
    if let Some(dir) = var("ENROOT_CONFIG_PATH") {
        return Path::new(&dir).join(".credentials");
    }
    let config = var("XDG_CONFIG_HOME").map(PathBuf::from).unwrap_or_else(|| Path::new(home).join(".config"));
    config.join("enroot").join(".credentials")
}

/// The user's login for `image`'s registry, read from their file as them; `None` without one.
pub fn user_login(
    image: &ImageRef,
    account: Option<&Account>,
    env: &[(String, String)],
) -> Result<Option<Login>, String> {
    let home = account.map(|a| a.home.clone()).unwrap_or_else(|| std::env::var("HOME").unwrap_or_default());
    let path = credentials_path(env, &home);
    let account = account.cloned();
    let read = std::thread::spawn(move || {
        crate::as_user::read_as(account.as_ref(), &path, 0, MAX_CREDENTIALS as u32).map(|d| (path, d))
    })
    .join()
    .map_err(|_| "reading the credentials failed".to_string())?;
    match read {
        Ok((_, data)) => Ok(find_login(&String::from_utf8_lossy(&data), &image.registry, image.user.as_deref())),
        // No file of theirs: anonymous.
        Err(e) if e.contains("No such file") || e.contains("not found") => Ok(None),
        Err(e) => Err(format!("cannot read your registry credentials: {e}")),
    }
}

/// The registries' side of the agent: its TLS roots and which registries speak plain HTTP, and
/// a client per user and login.
pub struct Registries {
    config: ClientConfigParts,
    clients: Mutex<HashMap<ClientKey, oci_client::Client>>,
}

/// Whose client: the uid, the registry, the login.
type ClientKey = (u32, String, Option<Login>);

struct ClientConfigParts {
    extra_roots: Vec<Vec<u8>>,
    http: Vec<String>,
}

impl Registries {
    /// `ca_files`: PEM files of CAs trusted beside the system's; `http`: registries reached over
    /// plain HTTP (test registries on loopback).
    pub fn new(ca_files: &[PathBuf], http: &[String]) -> Result<Registries, String> {
        // The OCI client's TLS is rustls with the process's provider: ring, as for the rest.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let extra_roots = ca_files
            .iter()
            .map(|p| std::fs::read(p).map_err(|e| format!("registry CA {}: {e}", p.display())))
            .collect::<Result<_, _>>()?;
        Ok(Registries {
            config: ClientConfigParts { extra_roots, http: http.to_vec() },
            clients: Mutex::new(HashMap::new()),
        })
    }

    /// The client `uid` uses with `login` for `registry`.
    pub fn client(&self, uid: u32, registry: &str, login: Option<&Login>) -> oci_client::Client {
        let key = (uid, registry.to_string(), login.cloned());
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        if clients.len() > 1024 {
            clients.clear();
        }
        clients
            .entry(key)
            .or_insert_with(|| {
                let config = ClientConfig {
                    protocol: if self.config.http.is_empty() {
                        ClientProtocol::Https
                    } else {
                        ClientProtocol::HttpsExcept(self.config.http.clone())
                    },
                    extra_root_certificates: self
                        .config
                        .extra_roots
                        .iter()
                        .map(|pem| Certificate { encoding: CertificateEncoding::Pem, data: pem.clone() })
                        .collect(),
                    connect_timeout: Some(std::time::Duration::from_secs(10)),
                    read_timeout: Some(std::time::Duration::from_secs(60)),
                    ..Default::default()
                };
                oci_client::Client::new(config)
            })
            .clone()
    }
}

/// The OCI client's authentication for `login`.
pub fn auth(login: Option<&Login>) -> RegistryAuth {
    match login {
        Some(l) => RegistryAuth::Basic(l.user.clone(), l.password.clone()),
        None => RegistryAuth::Anonymous,
    }
}

/// What went wrong talking to the registry, as a user can act on it.
pub fn explain(e: &OciDistributionError) -> String {
    match e {
        OciDistributionError::AuthenticationFailure(_) | OciDistributionError::UnauthorizedError { .. } => {
            "the registry refused the credentials (see ~/.config/enroot/.credentials)".into()
        }
        OciDistributionError::ImageManifestNotFoundError(_) => "no such image or tag in the registry".into(),
        OciDistributionError::RegistryError { envelope, .. } => {
            let text = envelope.to_string();
            let lower = text.to_ascii_lowercase().replace('_', " ");
            if lower.contains("unauthorized") || lower.contains("denied") {
                "the registry refused the credentials (see ~/.config/enroot/.credentials)".into()
            } else if lower.contains("manifest unknown") || lower.contains("name unknown") {
                "no such image or tag in the registry".into()
            } else {
                format!("the registry answered: {text}")
            }
        }
        OciDistributionError::ServerError { code, message, .. } => match code {
            401 | 403 => "the registry refused the credentials (see ~/.config/enroot/.credentials)".into(),
            404 => "no such image or tag in the registry".into(),
            _ => format!("the registry answered {code}: {message}"),
        },
        OciDistributionError::DigestError(d) => format!("a layer does not match its digest ({d})"),
        OciDistributionError::RequestError(r) if r.is_connect() || r.is_timeout() => {
            format!("the registry is unreachable ({})", source_chain(r))
        }
        OciDistributionError::RequestError(r) => format!("talking to the registry: {}", source_chain(r)),
        other => other.to_string(),
    }
}

fn source_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        text.push_str(": ");
        text.push_str(&s.to_string());
        next = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logins_are_found_as_enroot_finds_them() {
        let text = "machine nvcr.io login $oauthtoken password abc\n\
                    machine 127.0.0.1:5000 login alice password s3cret\n\
                    machine 127.0.0.1:5000 login bob password other\n\
                    machine docker.io login me password hub\n";
        let l = find_login(text, "127.0.0.1:5000", None).unwrap();
        assert_eq!((l.user.as_str(), l.password.as_str()), ("alice", "s3cret"));
        assert_eq!(find_login(text, "127.0.0.1:5000", Some("bob")).unwrap().password, "other");
        assert_eq!(find_login(text, "registry-1.docker.io", None).unwrap().password, "hub");
        assert_eq!(find_login(text, "nvcr.io", None).unwrap().user, "$oauthtoken");
        assert_eq!(find_login(text, "quay.io", None), None);
        assert_eq!(find_login("default login x password y", "quay.io", None).unwrap().user, "x");
        assert!(!format!("{l:?}").contains("s3cret"));
    }

    #[test]
    fn the_credentials_file_is_where_enroot_keeps_it() {
        let env =
            |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>();
        assert_eq!(credentials_path(&env(&[]), "/home/a"), Path::new("/home/a/.config/enroot/.credentials"));
        assert_eq!(
            credentials_path(&env(&[("XDG_CONFIG_HOME", "/x")]), "/home/a"),
            Path::new("/x/enroot/.credentials")
        );
        assert_eq!(credentials_path(&env(&[("ENROOT_CONFIG_PATH", "/e")]), "/home/a"), Path::new("/e/.credentials"));
    }
}
