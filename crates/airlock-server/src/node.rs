//! Node names (`airlock serve --node NAME`) and the ids that carry them.
//!
//! A daemon with a node name hands out every session and snapshot id as `NAME--<id>`, so a
//! stateless front (`airlock serve --route`) finds the node that owns an id from the id
//! alone. A name is 1 to [`MAX_NODE_LEN`] of `[a-z0-9]`, single hyphens inside, never at
//! either end: it never contains `--`, so the first `--` of an id ends the node's name,
//! and `8000-NAME--<id>` stays one DNS label (at most 63 characters) for the port hosts.

/// The longest node name: `8000-` + name + `--` + `vm-` + 16 hex digits fit in a DNS
/// label's 63 characters with room to spare.
pub const MAX_NODE_LEN: usize = 20;

/// What separates a node's name from the id it minted.
pub const SEPARATOR: &str = "--";

/// `name` if it is a valid node name, else why not (for the flag's error message).
pub fn validate(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_NODE_LEN {
        return Err(format!(
            "{name:?} is not a node name: it must be 1 to {MAX_NODE_LEN} characters, got {}",
            name.len()
        ));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err(format!(
            "{name:?} is not a node name: use only lowercase letters a-z, digits and single hyphens"
        ));
    }
    if name.starts_with('-') || name.ends_with('-') || name.contains(SEPARATOR) {
        return Err(format!(
            "{name:?} is not a node name: a hyphen may not start or end it, nor follow another"
        ));
    }
    Ok(())
}

/// The node an id names, and the id the node minted: `("n1", "2ffefa68b8534ad2")` for
/// `n1--2ffefa68b8534ad2`; `None` for an id without a (valid) node name.
pub fn split(id: &str) -> Option<(&str, &str)> {
    let (node, local) = id.split_once(SEPARATOR)?;
    if validate(node).is_err() || local.is_empty() {
        return None;
    }
    Some((node, local))
}

/// The id `local` as the node `node` hands it out (`local` itself without a node name).
pub fn qualify(node: Option<&str>, local: &str) -> String {
    match node {
        Some(node) => format!("{node}{SEPARATOR}{local}"),
        None => local.to_owned(),
    }
}

/// The id the node `node` minted for the id a request gave: the part after `node--`;
/// `None` when the request's id names another node or none (the caller answers 404).
/// Without a node name, ids are taken as they are.
pub fn local<'a>(node: Option<&str>, id: &'a str) -> Option<&'a str> {
    match node {
        None => Some(id),
        Some(node) => match split(id) {
            Some((n, local)) if n == node => Some(local),
            _ => None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_are_lowercase_alphanumerics_with_single_inner_hyphens() {
        for good in ["n1", "a", "node-7", "a-b-c", "01234567890123456789"] {
            assert_eq!(validate(good), Ok(()), "{good}");
        }
        for bad in [
            "",
            "N1",
            "n_1",
            "n.1",
            "-n1",
            "n1-",
            "n--1",
            "012345678901234567890",
            "nö",
            "n 1",
        ] {
            assert!(validate(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn an_id_splits_at_its_first_double_hyphen_into_node_and_local_id() {
        assert_eq!(split("n1--2ffefa68b8534ad2"), Some(("n1", "2ffefa68b8534ad2")));
        assert_eq!(
            split("n-1--gv-2ffefa68b8534ad2"),
            Some(("n-1", "gv-2ffefa68b8534ad2"))
        );
        assert_eq!(
            split("n1--snap-0123456789abcdef"),
            Some(("n1", "snap-0123456789abcdef"))
        );
        for bad in [
            "2ffefa68b8534ad2",
            "gv-2ffefa68b8534ad2",
            "--x",
            "n1--",
            "N1--x",
            "n1-x",
        ] {
            assert_eq!(split(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_node_takes_only_its_own_ids_and_without_a_name_every_id() {
        assert_eq!(qualify(Some("n1"), "abc"), "n1--abc");
        assert_eq!(qualify(None, "abc"), "abc");
        assert_eq!(local(Some("n1"), "n1--abc"), Some("abc"));
        assert_eq!(local(Some("n1"), "n2--abc"), None);
        assert_eq!(local(Some("n1"), "abc"), None);
        assert_eq!(local(None, "abc"), Some("abc"));
        assert_eq!(local(None, "n2--abc"), Some("n2--abc"));
    }
}
