//! Tokens for callers that cannot use MUNGE (off the cluster; the HTTP API later): JSON Web
//! Tokens signed with HMAC-SHA256, like Slurm's `auth/jwt`. The controllers hold several keys:
//! the first signs, all verify, so keys rotate without downtime (add the new key second,
//! then move it first, then drop the old one once its tokens expired).

use std::path::Path;

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use ring::hmac;
use serde::{Deserialize, Serialize};

/// What a token says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// The user name.
    pub sub: String,
    /// Issued at, seconds since the epoch.
    pub iat: u64,
    /// Expires at, seconds since the epoch.
    pub exp: u64,
}

#[derive(Serialize, Deserialize)]
struct Header {
    alg: String,
    typ: String,
    kid: String,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("malformed token")]
    Malformed,
    #[error("token signed with an unknown key '{0}'")]
    UnknownKey(String),
    #[error("token signature does not verify")]
    BadSignature,
    #[error("token expired {0} s ago")]
    Expired(u64),
    #[error("token issued in the future")]
    NotYetValid,
}

struct Key {
    id: String,
    key: hmac::Key,
}

/// The controllers' token keys; the first signs.
pub struct Tokens {
    keys: Vec<Key>,
}

impl Tokens {
    /// Keys from files of hex text (`token.key` from `quorum admin certs`).
    pub fn load(paths: &[impl AsRef<Path>]) -> anyhow::Result<Tokens> {
        let mut keys = Vec::new();
        for p in paths {
            let p = p.as_ref();
            let text = std::fs::read_to_string(p)
                .map_err(|e| anyhow::anyhow!("reading the token key {}: {e}", p.display()))?;
            let secret = text.trim().as_bytes().to_vec();
            if secret.len() < 32 {
                anyhow::bail!("the token key {} is too short (at least 32 characters)", p.display());
            }
            let id = crate::launch::spec_digest([secret.as_slice()])[..12].to_string();
            keys.push(Key { id, key: hmac::Key::new(hmac::HMAC_SHA256, &secret) });
        }
        if keys.is_empty() {
            anyhow::bail!("no token key");
        }
        Ok(Tokens { keys })
    }

    /// A token for `user` valid `lifespan_s` from `now_s`.
    pub fn mint(&self, user: &str, now_s: u64, lifespan_s: u64) -> String {
        let key = &self.keys[0];
        let header = Header { alg: "HS256".into(), typ: "JWT".into(), kid: key.id.clone() };
        let claims = Claims { sub: user.to_string(), iat: now_s, exp: now_s.saturating_add(lifespan_s) };
        let signed = format!(
            "{}.{}",
            B64.encode(serde_json::to_vec(&header).expect("header")),
            B64.encode(serde_json::to_vec(&claims).expect("claims"))
        );
        let tag = hmac::sign(&key.key, signed.as_bytes());
        format!("{signed}.{}", B64.encode(tag.as_ref()))
    }

    /// The claims of `token` when a key of ours signed it and it is valid at `now_s`, give or
    /// take `skew_s`.
    pub fn verify(&self, token: &str, now_s: u64, skew_s: u64) -> Result<Claims, TokenError> {
        let (signed, tag) = token.rsplit_once('.').ok_or(TokenError::Malformed)?;
        let (header, claims) = signed.split_once('.').ok_or(TokenError::Malformed)?;
        let header: Header =
            B64.decode(header).ok().and_then(|h| serde_json::from_slice(&h).ok()).ok_or(TokenError::Malformed)?;
        if header.alg != "HS256" {
            return Err(TokenError::Malformed);
        }
        let key = self.keys.iter().find(|k| k.id == header.kid).ok_or(TokenError::UnknownKey(header.kid))?;
        let tag = B64.decode(tag).map_err(|_| TokenError::Malformed)?;
        hmac::verify(&key.key, signed.as_bytes(), &tag).map_err(|_| TokenError::BadSignature)?;
        let claims: Claims =
            B64.decode(claims).ok().and_then(|c| serde_json::from_slice(&c).ok()).ok_or(TokenError::Malformed)?;
        if claims.exp.saturating_add(skew_s) < now_s {
            return Err(TokenError::Expired(now_s - claims.exp));
        }
        if claims.iat > now_s.saturating_add(skew_s) {
            return Err(TokenError::NotYetValid);
        }
        Ok(claims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(dir: &Path, name: &str, secret: &str) -> std::path::PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, secret).unwrap();
        p
    }

    #[test]
    fn tokens_verify_with_any_current_key_until_they_expire() {
        let dir = tempfile::tempdir().unwrap();
        let old = key(dir.path(), "old", &"a".repeat(64));
        let new = key(dir.path(), "new", &"b".repeat(64));
        let before = Tokens::load(&[&old]).unwrap();
        let token = before.mint("alice", 1_000, 3_600);
        // Rotation: the new key signs, the old one still verifies.
        let during = Tokens::load(&[&new, &old]).unwrap();
        assert_eq!(during.verify(&token, 2_000, 0).unwrap().sub, "alice");
        assert_eq!(during.verify(&during.mint("bob", 1_000, 10), 1_005, 0).unwrap().sub, "bob");
        let after = Tokens::load(&[&new]).unwrap();
        assert!(matches!(after.verify(&token, 2_000, 0), Err(TokenError::UnknownKey(_))));
        assert_eq!(before.verify(&token, 4_700, 30), Err(TokenError::Expired(100)));
        assert!(before.verify(&token, 4_620, 30).is_ok(), "within the skew");
        let (signed, _) = token.rsplit_once('.').unwrap();
        let claims = B64.encode(br#"{"sub":"root","iat":1000,"exp":99999}"#);
        let forged = format!("{}.{claims}.{}", signed.split_once('.').unwrap().0, token.rsplit_once('.').unwrap().1);
        assert_eq!(before.verify(&forged, 2_000, 0), Err(TokenError::BadSignature));
        assert_eq!(before.verify("nonsense", 2_000, 0), Err(TokenError::Malformed));
        assert!(Tokens::load(&[key(dir.path(), "short", "abc")]).is_err());
    }
}
