use super::*;
use crate::names::shard_db_path;
use crate::record::rec;
use std::path::{Path, PathBuf};

#[test]
fn exact_bytes() {
    assert_eq!(
        shard_db_path(Path::new("/d"), 7),
        PathBuf::from("/d/shard-7")
    );
    assert_eq!(encode_key(0x0102), [0, 0, 0, 0, 0, 0, 1, 2]);
    assert_eq!(
        encode_value(3, 5, b"xy"),
        vec![3, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, b'x', b'y']
    );
    let p = ProgressMarker {
        next_seq: 2,
        finished: true,
        last_id: 9,
        fingerprint: b"ab".to_vec(),
    };
    let b = p.encode();
    assert_eq!(
        b,
        vec![2, 0, 0, 0, 0, 0, 0, 0, 1, 9, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, b'a', b'b']
    );
    assert_eq!(ProgressMarker::decode(&b), Ok(p));
    assert!(ProgressMarker::decode(&b[..5]).is_err());
    assert!(ProgressMarker::decode(&b[..22]).is_err());
    assert_eq!(
        decode_item(&encode_key(42), &encode_value(1, 2, b"")),
        Ok(rec(42, 1, 2, b""))
    );
    assert!(decode_item(&[1, 2], &encode_value(1, 2, b"")).is_err());
    assert!(decode_item(&encode_key(1), &[0; 11]).is_err());
}
