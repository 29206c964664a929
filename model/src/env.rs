//! A job's environment, as `--export` sends it: the submitting shell's variables, a few KB.
//!
//! A million pending jobs must fit a replica's memory, and as separate strings a 40-variable
//! environment costs about 6 KB a job. So an [`Env`] is one packed block, and equal blocks are
//! shared: jobs submitted from the same shell carry the same environment, and each decoded
//! copy (from a log entry, a snapshot or a request) is looked up in a pool of the blocks alive
//! and shares the one found. Sharing is invisible: an `Env` encodes as the list of pairs it
//! always was, so log entries, snapshots and digests are unchanged.
//!
//! A snapshot writes each distinct environment once ([`EnvTable`], [`encode_by_reference`]) and
//! every job's as its index in that table ([`decode_by_reference`] reads it back), so that the
//! same few KB are not written a million times.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use serde::de::{SeqAccess, Visitor};
use serde::ser::SerializeSeq;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Variables that hold a credential of the submitting shell: Quorum's token and Slurm's JWT. A
/// job never carries them (`--export=ALL` means the user's variables, not the client's
/// credentials): the client leaves them out, and the controllers drop any that a request still
/// carries, so that no job record, log entry or spool file holds one.
pub const CREDENTIAL_VARIABLES: [&str; 2] = ["QUORUM_TOKEN", "SLURM_JWT"];

/// Whether variable `name` holds a credential that a job must not carry.
pub fn is_credential(name: &str) -> bool {
    CREDENTIAL_VARIABLES.contains(&name)
}

/// Environment variables in order, as one shared block: each name and value prefixed with its
/// length (so any string packs unambiguously).
#[derive(Clone, Default)]
pub struct Env(Option<Arc<[u8]>>);

impl Env {
    /// Packs `vars` and shares an equal block if one is alive.
    pub fn new<N: AsRef<str>, V: AsRef<str>>(vars: impl IntoIterator<Item = (N, V)>) -> Env {
        let mut packed = Vec::new();
        for (name, value) in vars {
            for s in [name.as_ref(), value.as_ref()] {
                let len =
                    u32::try_from(s.len()).expect("an environment string is under 4 GiB (a request is far smaller)");
                packed.extend_from_slice(&len.to_le_bytes());
                packed.extend_from_slice(s.as_bytes());
            }
        }
        if packed.is_empty() {
            return Env(None);
        }
        Env(Some(intern(packed)))
    }

    /// The variables in order, as (name, value).
    pub fn iter(&self) -> EnvIter<'_> {
        EnvIter { rest: self.0.as_deref().unwrap_or(&[]) }
    }

    pub fn len(&self) -> usize {
        self.iter().count()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// The value of `name`, the last one if it is set twice.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.iter().filter(|(n, _)| *n == name).map(|(_, v)| v).last()
    }

    /// Whether `self` and `other` share one block.
    pub fn same(&self, other: &Env) -> bool {
        match (&self.0, &other.0) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        }
    }
}

/// Iterates an [`Env`]'s variables.
pub struct EnvIter<'a> {
    rest: &'a [u8],
}

impl<'a> EnvIter<'a> {
    fn take(&mut self) -> &'a str {
        let (len, rest) = self.rest.split_at(4);
        let len = u32::from_le_bytes(len.try_into().expect("four bytes")) as usize;
        let (s, rest) = rest.split_at(len);
        self.rest = rest;
        std::str::from_utf8(s).expect("packed from a str by Env::new")
    }
}

impl<'a> Iterator for EnvIter<'a> {
    type Item = (&'a str, &'a str);

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        Some((self.take(), self.take()))
    }
}

impl<N: AsRef<str>, V: AsRef<str>> FromIterator<(N, V)> for Env {
    fn from_iter<I: IntoIterator<Item = (N, V)>>(iter: I) -> Self {
        Env::new(iter)
    }
}

impl PartialEq for Env {
    fn eq(&self, other: &Env) -> bool {
        self.same(other) || self.0.as_deref().unwrap_or(&[]) == other.0.as_deref().unwrap_or(&[])
    }
}

impl Eq for Env {}

impl fmt::Debug for Env {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// The distinct environments of a snapshot, each once, in the order first added.
#[derive(Default)]
pub struct EnvTable {
    /// Block address → index in `envs`.
    index: HashMap<usize, u32>,
    envs: Vec<Env>,
}

/// Where a shared block lives: equal for every `Env` sharing it.
fn address(block: &Arc<[u8]>) -> usize {
    Arc::as_ptr(block) as *const u8 as usize
}

impl EnvTable {
    /// Adds `env` unless a shared or empty one is in already.
    pub fn add(&mut self, env: &Env) {
        let Some(block) = &env.0 else { return };
        let next = self.envs.len() as u32;
        self.index.entry(address(block)).or_insert_with(|| {
            self.envs.push(env.clone());
            next
        });
    }

    pub fn envs(&self) -> &[Env] {
        &self.envs
    }

    fn position(&self, env: &Env) -> Option<u32> {
        env.0.as_ref().and_then(|b| self.index.get(&address(b)).copied())
    }
}

thread_local! {
    static ENCODING: RefCell<Option<EnvTable>> = const { RefCell::new(None) };
    static DECODING: RefCell<Option<Vec<Env>>> = const { RefCell::new(None) };
}

/// Puts back what a thread-local held before, also when the closure panics.
struct Restore<T: 'static>(&'static std::thread::LocalKey<RefCell<Option<T>>>, Option<T>);

impl<T> Drop for Restore<T> {
    fn drop(&mut self) {
        let before = self.1.take();
        self.0.with(|cell| *cell.borrow_mut() = before);
    }
}

/// Runs `f` (which serializes) with every environment in `table` written as its index there;
/// one outside it is written in full.
pub fn encode_by_reference<R>(table: EnvTable, f: impl FnOnce() -> R) -> R {
    let before = ENCODING.with(|cell| cell.borrow_mut().replace(table));
    let _restore = Restore(&ENCODING, before);
    f()
}

/// Runs `f` (which deserializes) with an environment written as an index read from `envs`.
pub fn decode_by_reference<R>(envs: Vec<Env>, f: impl FnOnce() -> R) -> R {
    let before = DECODING.with(|cell| cell.borrow_mut().replace(envs));
    let _restore = Restore(&DECODING, before);
    f()
}

impl Serialize for Env {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if let Some(i) = ENCODING.with(|cell| cell.borrow().as_ref().and_then(|t| t.position(self))) {
            return serializer.serialize_u32(i);
        }
        let mut seq = serializer.serialize_seq(None)?;
        for var in self.iter() {
            seq.serialize_element(&var)?;
        }
        seq.end()
    }
}

/// One variable as decoded, borrowed from the input where it has no escapes.
#[derive(Deserialize)]
struct Var<'a>(#[serde(borrow)] Cow<'a, str>, #[serde(borrow)] Cow<'a, str>);

impl<'de> Deserialize<'de> for Env {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Vars;
        impl<'de> Visitor<'de> for Vars {
            type Value = Env;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of [name, value] pairs, or in a snapshot an index in its environments")
            }
            fn visit_u64<E: serde::de::Error>(self, i: u64) -> Result<Env, E> {
                DECODING.with(|cell| match cell.borrow().as_ref() {
                    Some(envs) => envs.get(i as usize).cloned().ok_or_else(|| {
                        E::custom(format!("environment {i} is not in the snapshot's {} environments", envs.len()))
                    }),
                    None => Err(E::custom(format!("environment {i} given by index outside a snapshot"))),
                })
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Env, A::Error> {
                // Packed as they come: no string is made per variable.
                let mut vars = Vec::with_capacity(seq.size_hint().unwrap_or(0));
                while let Some(Var(name, value)) = seq.next_element()? {
                    vars.push((name, value));
                }
                Ok(Env::new(vars))
            }
        }
        // `any`, not `seq`: in a snapshot an environment may be an index.
        deserializer.deserialize_any(Vars)
    }
}

/// The blocks alive, by hash of their bytes.
#[derive(Default)]
struct Pool {
    blocks: HashMap<u64, Vec<Weak<[u8]>>>,
    /// Dead entries are swept when the map reaches this size.
    sweep_at: usize,
}

fn intern(packed: Vec<u8>) -> Arc<[u8]> {
    static POOL: OnceLock<Mutex<Pool>> = OnceLock::new();
    let mut hasher = DefaultHasher::new();
    packed.hash(&mut hasher);
    let hash = hasher.finish();
    let mut pool = POOL.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    let same_hash = pool.blocks.entry(hash).or_default();
    if let Some(found) = same_hash.iter().filter_map(Weak::upgrade).find(|b| **b == *packed) {
        return found;
    }
    let block: Arc<[u8]> = packed.into();
    same_hash.retain(|w| w.strong_count() > 0);
    same_hash.push(Arc::downgrade(&block));
    if pool.blocks.len() >= pool.sweep_at {
        pool.blocks.retain(|_, blocks| {
            blocks.retain(|w| w.strong_count() > 0);
            !blocks.is_empty()
        });
        pool.sweep_at = (2 * pool.blocks.len()).max(1024);
    }
    block
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn by_reference_each_distinct_environment_is_written_once_and_read_back_shared() {
        let a = Env::new([("HOME", "/home/a"), ("PATH", "/bin")]);
        let b = Env::new([("HOME", "/home/b")]);
        let jobs = vec![a.clone(), b.clone(), Env::default(), Env::new([("HOME", "/home/a"), ("PATH", "/bin")])];
        let mut table = EnvTable::default();
        for env in &jobs {
            table.add(env);
        }
        assert_eq!(table.envs().len(), 2, "equal environments share a block, the empty one is not listed");
        let envs = serde_json::to_string(table.envs()).unwrap();
        let body = encode_by_reference(table, || serde_json::to_string(&jobs).unwrap());
        assert_eq!(body, "[0,1,[],0]");
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            r#"[["HOME","/home/a"],["PATH","/bin"]]"#,
            "in full again after"
        );

        let envs: Vec<Env> = serde_json::from_str(&envs).unwrap();
        let back: Vec<Env> = decode_by_reference(envs, || serde_json::from_str(&body).unwrap());
        assert_eq!(back, jobs);
        assert!(back[0].same(&back[3]) && back[0].same(&a));

        let e = serde_json::from_str::<Vec<Env>>("[0]").unwrap_err().to_string();
        assert!(e.contains("environment 0 given by index outside a snapshot"), "{e}");
        let e = decode_by_reference(vec![a], || serde_json::from_str::<Vec<Env>>("[0,1]").unwrap_err().to_string());
        assert!(e.contains("environment 1 is not in the snapshot's 1 environments"), "{e}");
    }

    fn vars(n: usize, tag: &str) -> Vec<(String, String)> {
        (0..n).map(|i| (format!("VAR_{i}"), format!("/opt/{tag}/{i}"))).collect()
    }

    #[test]
    fn packs_any_strings_in_order() {
        let odd = vec![
            ("A".to_string(), "b=c".to_string()),
            (String::new(), String::new()),
            ("NUL\0IN".into(), "é\u{1F600}".into()),
            ("A".into(), "again".into()),
        ];
        let env = Env::new(odd.clone());
        let back: Vec<(String, String)> = env.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
        assert_eq!(back, odd);
        assert_eq!(env.len(), 4);
        assert_eq!(env.get("A"), Some("again"));
        assert_eq!(env.get("B"), None);
        assert!(Env::new(Vec::<(String, String)>::new()).is_empty());
        // Escaped in JSON (decoded into owned strings) as well as plain (borrowed).
        let json = serde_json::to_string(&env).unwrap();
        assert!(json.contains("\\u0000"), "{json}");
        assert_eq!(serde_json::from_str::<Env>(&json).unwrap(), env);
        let quoted = Env::new([("Q", "say \"hi\"\nthen go")]);
        assert_eq!(serde_json::from_str::<Env>(&serde_json::to_string(&quoted).unwrap()).unwrap(), quoted);
        assert!(serde_json::from_str::<Env>("[[\"A\"]]").is_err(), "a pair without its value");
    }

    #[test]
    fn encodes_as_the_list_of_pairs_it_replaced() {
        let v = vars(3, "x");
        let env = Env::new(v.clone());
        assert_eq!(serde_json::to_string(&env).unwrap(), serde_json::to_string(&v).unwrap());
        let decoded: Env = serde_json::from_str(&serde_json::to_string(&v).unwrap()).unwrap();
        assert_eq!(decoded, env);
        assert_eq!(
            format!("{env:?}"),
            format!("{:?}", v.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect::<Vec<_>>())
        );
    }

    #[test]
    fn equal_environments_share_one_block_while_one_is_alive() {
        let a = Env::new(vars(40, "shared"));
        let b: Env = serde_json::from_str(&serde_json::to_string(&vars(40, "shared")).unwrap()).unwrap();
        assert!(a.same(&b), "a decoded copy of a live environment shares its block");
        let c = Env::new(vars(40, "other"));
        assert!(!a.same(&c) && a != c);
        // Once every holder is gone the block is freed, and the next one is new.
        let weak = Arc::downgrade(a.0.as_ref().unwrap());
        drop((a, b));
        assert!(weak.upgrade().is_none(), "the pool keeps no block alive");
        let d = Env::new(vars(40, "shared"));
        assert_eq!(d, Env::new(vars(40, "shared")));
    }
}
