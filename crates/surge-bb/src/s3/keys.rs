//! Export keys: the bucket as other S3 tools see it. A file at `a/b/c` is the
//! object whose key is its UTF-8 path, `a/b/c`; a directory `a/b` is also the
//! empty object `a/b/` (a marker, as s3fs and the AWS console write them).
//!
//! object_store's `Path::parse` keeps a key as it is and refuses only ASCII
//! control characters (and empty, `.` and `..` segments, which file names
//! never are); S3 list responses are XML, which cannot carry U+FFFE or U+FFFF
//! either. Only those characters are percent-encoded (their UTF-8 bytes,
//! `%0A`). A `%` stays a `%` unless what follows it would read as such an
//! escape (or as `%25`): then it is written `%25`, so `%41.txt` is the key
//! `%41.txt` and every key decodes to exactly the name it came from.
//! (`PathPart::from`, which older surge used, percent-encodes every non-ASCII
//! byte and many punctuation marks: `ü` became `%C3%BC`.)

use object_store::path::PathPart;
use percent_encoding::percent_decode_str;
use std::fmt::Write;

/// A character no export key carries as itself.
fn must_escape(c: char) -> bool {
    c.is_ascii_control() || c == '\u{FFFE}' || c == '\u{FFFF}'
}

fn hex_digit(x: u8) -> Option<u8> {
    match x {
        b'0'..=b'9' => Some(x - b'0'),
        b'A'..=b'F' => Some(x - b'A' + 10),
        _ => None,
    }
}

/// The character an escape at the start of `s` stands for and the escape's
/// length, if `s` starts with one that [`encode_name`] writes (upper-case hex).
fn escape_at(s: &str) -> Option<(char, usize)> {
    let b = s.as_bytes();
    let byte = |i: usize| -> Option<u8> {
        (*b.get(i)? == b'%').then_some(())?;
        Some(hex_digit(*b.get(i + 1)?)? << 4 | hex_digit(*b.get(i + 2)?)?)
    };
    let first = byte(0)?;
    let n = match first {
        0x00..=0x7F => 1,
        0xE0..=0xEF => 3, // U+FFFE and U+FFFF are the only longer ones escaped
        _ => return None,
    };
    let mut utf8 = [first, 0, 0];
    for (k, slot) in utf8.iter_mut().enumerate().take(n).skip(1) {
        *slot = byte(3 * k)?;
    }
    let c = std::str::from_utf8(&utf8[..n]).ok()?.chars().next()?;
    (must_escape(c) || c == '%').then_some((c, 3 * n))
}

/// One file name as one key segment.
pub fn encode_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for (i, c) in name.char_indices() {
        if must_escape(c) || (c == '%' && escape_at(&name[i..]).is_some()) {
            for b in c.encode_utf8(&mut [0; 4]).bytes() {
                let _ = write!(out, "%{b:02X}");
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The file name a key segment written by [`encode_name`] stands for.
pub fn decode_name(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    let mut rest = segment;
    while let Some(c) = rest.chars().next() {
        let (c, n) = escape_at(rest).unwrap_or((c, c.len_utf8()));
        out.push(c);
        rest = &rest[n..];
    }
    out
}

/// The export key of the file at `a/b/c`.
pub fn export_key(path: &str) -> String {
    path.split('/').filter(|p| !p.is_empty()).map(encode_name).collect::<Vec<_>>().join("/")
}

/// The marker object of the directory at `a/b`: `a/b/`.
pub fn dir_marker_key(path: &str) -> String {
    format!("{}/", export_key(path))
}

/// The names along a key (a marker's trailing `/` ends no name).
pub fn names_of_key(key: &str) -> Vec<String> {
    key.split('/').filter(|p| !p.is_empty()).map(decode_name).collect()
}

/// The name an older surge (before UTF-8 keys) exported as `segment`, if
/// `segment` is exactly what it wrote for some name and differs from that
/// name: it percent-encoded with `PathPart::from`, whose inverse is a plain
/// percent-decode. `%41.txt` is not such a segment (`PathPart::from("A.txt")`
/// is `A.txt`); `%C3%BC` is (`ü`).
pub fn legacy_name(segment: &str) -> Option<String> {
    if !segment.contains('%') {
        return None;
    }
    let name = percent_decode_str(segment).decode_utf8().ok()?;
    let valid = !name.is_empty() && name != "." && name != ".." && !name.contains('/');
    (valid && PathPart::from(name.as_ref()).as_ref() == segment).then(|| name.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::path::Path;
    use proptest::prelude::*;

    #[test]
    fn keys_are_the_utf8_paths() {
        assert_eq!(export_key("ünï/cödé.bin"), "ünï/cödé.bin");
        assert_eq!(export_key("a b/c+d=e&f?.bin"), "a b/c+d=e&f?.bin");
        assert_eq!(export_key("%41.txt"), "%41.txt");
        assert_eq!(export_key("x#y"), "x#y");
        assert_eq!(export_key("100%"), "100%");
        assert_eq!(dir_marker_key("nested/empty"), "nested/empty/");
    }

    #[test]
    fn only_what_s3_cannot_carry_is_escaped_and_a_percent_that_would_read_as_an_escape() {
        assert_eq!(encode_name("line\nbreak"), "line%0Abreak");
        assert_eq!(encode_name("del\u{7f}"), "del%7F");
        assert_eq!(encode_name("nc\u{FFFF}"), "nc%EF%BF%BF");
        assert_eq!(encode_name("%0A"), "%250A");
        assert_eq!(encode_name("%25"), "%2525");
        assert_eq!(encode_name("%0a"), "%0a"); // lower case is never an escape
        assert_eq!(encode_name("%C3%BC"), "%C3%BC");
        assert_eq!(decode_name("%250A"), "%0A");
        assert_eq!(decode_name("%C3%BC"), "%C3%BC");
    }

    #[test]
    fn older_surge_keys_decode_to_their_names_and_others_do_not() {
        assert_eq!(legacy_name("%C3%BCn%C3%AF").as_deref(), Some("ünï"));
        assert_eq!(legacy_name("c%C3%B6d%C3%A9.bin").as_deref(), Some("cödé.bin"));
        assert_eq!(legacy_name("x%23y").as_deref(), Some("x#y"));
        assert_eq!(legacy_name("%41.txt"), None);
        assert_eq!(legacy_name("100%"), None);
        assert_eq!(legacy_name("plain"), None);
        assert_eq!(legacy_name("%2E"), None);
    }

    /// A valid file name: any characters but `/` and NUL, not `.` or `..`.
    fn name() -> impl Strategy<Value = String> {
        prop_oneof![
            "[^/\u{0}]{1,24}",
            // Dense in what the mapping treats specially.
            proptest::collection::vec(prop_oneof![
                Just("%".to_string()),
                Just("%2".to_string()),
                Just("%25".to_string()),
                Just("%0A".to_string()),
                Just("%EF%BF".to_string()),
                Just("%BE".to_string()),
                "[0-9A-Fa-f]",
                "[\u{1}-\u{1f}\u{7f}\u{FFFE}\u{FFFF}]",
                "[ -~]",
                "[ü#?é]",
            ], 1..12)
            .prop_map(|v| v.concat()),
        ]
        .prop_filter("a file name", |n| n != "." && n != ".." && !n.contains(['/', '\0']))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        #[test]
        fn path_to_key_to_path_round_trips(names in proptest::collection::vec(name(), 1..5)) {
            let path = names.join("/");
            let key = export_key(&path);
            prop_assert_eq!(names_of_key(&key), names.clone());
            prop_assert_eq!(names_of_key(&dir_marker_key(&path)), names.clone());
            // object_store sends the key as it is, and S3 can list it.
            let parsed = Path::parse(&key).unwrap();
            prop_assert_eq!(parsed.as_ref(), key.as_str());
            prop_assert!(!key.chars().any(must_escape));
            // Nothing but the escaped characters is changed.
            if !path.contains('%') && !path.chars().any(must_escape) {
                prop_assert_eq!(&key, &path);
            }
        }

        #[test]
        fn older_surge_keys_decode_to_the_names_written(n in name()) {
            let old = PathPart::from(n.as_str()).as_ref().to_string();
            if old != n {
                prop_assert_eq!(legacy_name(&old), Some(n));
            }
        }
    }
}
