//! [`Shared`]: a part of the state that scheduling views share instead of copying.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A value the state owns and every scheduling view of it shares: taking a view costs a
/// reference count, not a copy, and changing it copies only while a view still holds the old
/// value (copy on write). It serializes as the value itself, so snapshots and digests are the
/// same as for a plain field.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Shared<T>(Arc<T>);

impl<T> Shared<T> {
    pub fn new(value: T) -> Self {
        Shared(Arc::new(value))
    }

    /// Whether both are the same value in memory (not merely equal).
    pub fn same(a: &Shared<T>, b: &Shared<T>) -> bool {
        Arc::ptr_eq(&a.0, &b.0)
    }
}

impl<K, V> Shared<std::collections::BTreeMap<K, V>> {
    /// Whether the map is empty (for `skip_serializing_if`).
    pub fn is_empty_map(&self) -> bool {
        self.0.is_empty()
    }
}

impl<T> From<T> for Shared<T> {
    fn from(value: T) -> Self {
        Shared::new(value)
    }
}

impl<T> Deref for Shared<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: Clone> DerefMut for Shared<T> {
    fn deref_mut(&mut self) -> &mut T {
        Arc::make_mut(&mut self.0)
    }
}

impl<T: Serialize> Serialize for Shared<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.as_ref().serialize(s)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Shared<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        T::deserialize(d).map(Shared::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_on_write_only_while_shared_and_serializes_as_the_value() {
        let mut a: Shared<Vec<u32>> = vec![1, 2].into();
        let view = a.clone();
        a.push(3);
        assert_eq!((&*a, &*view), (&vec![1, 2, 3], &vec![1, 2]), "the view keeps what it saw");
        drop(view);
        let before = Arc::as_ptr(&a.0);
        a.push(4);
        assert_eq!(Arc::as_ptr(&a.0), before, "no copy once unshared");
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(json, "[1,2,3,4]");
        assert_eq!(serde_json::from_str::<Shared<Vec<u32>>>(&json).unwrap(), a);
    }
}
