//! `merger verify` and `merger cat`: a list read back, whatever its version, from a file
//! or S3, one file or the parts of one list in order.

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use qformat::listbin::ListReader;
use qformat::{OpenedList, Record};
use qstore::{Location, Store, StoreOptions};

use crate::MergeError;

/// `merger verify FILE...`: checks the files as one list (a version 1 list.bin alone, or
/// runs: the parts of one list in order) and returns the line that says what it found.
///
/// # Errors
/// The first problem, naming the file (and the byte offset where it has one).
pub fn verify_files(files: &[String]) -> anyhow::Result<String> {
    let opened = open_files(files, || Ok(()))
        .with_context(|| format!("{} is not a valid list.bin", files.join(" ")))?;
    match opened {
        OpenedList::V1(reader) => verify_v1(Path::new(&files[0]), reader),
        OpenedList::Run(()) => verify_runs(files),
    }
}

/// [`verify_files`] of runs: the parts of one list in order.
fn verify_runs(files: &[String]) -> anyhow::Result<String> {
    let store = Store::new(StoreOptions::default());
    let locations = files
        .iter()
        .map(|f| Location::parse(f))
        .collect::<Result<Vec<_>, _>>()
        .map_err(MergeError::Store)?;
    let s = crate::verify::verify_lists(&store, &locations)
        .with_context(|| format!("{} is not a valid list.bin", files.join(" ")))?;
    let ids = match s.ids {
        Some((a, b)) => format!("ids {a}..={b}"),
        None => "no ids".to_string(),
    };
    let parts = if s.files > 1 {
        format!(" in {} parts", s.files)
    } else {
        String::new()
    };
    let shards = if s.growing {
        format!("{} shards, a prefix of a growing list (a follow's parts, the last of which does not end at the last id)", s.shards)
    } else {
        format!("{} shards complete", s.shards)
    };
    Ok(format!(
        "{}: OK: {} records{parts}, {} bytes, {ids}, strictly increasing, {shards}, every block checksum verified",
        files.join(" "),
        s.records,
        s.bytes,
    ))
}

/// The files opened by their version, through qformat's switch ([`qformat::open_list`]):
/// only one local file can be version 1 (the parts of a split are runs, and an S3 object
/// never is one: version 1 was never uploaded); anything else is opened by `open_runs`.
fn open_files<R>(
    files: &[String],
    open_runs: impl FnOnce() -> anyhow::Result<R>,
) -> anyhow::Result<OpenedList<R>> {
    match files {
        [one] if !one.starts_with("s3://") => qformat::open_list(Path::new(one), open_runs),
        _ => open_runs().map(OpenedList::Run),
    }
}

fn verify_v1(file: &Path, reader: ListReader<impl std::io::Read>) -> anyhow::Result<String> {
    let s = reader
        .verify_rest()
        .with_context(|| format!("{} is not a valid list.bin", file.display()))?;
    let ids = match (s.first_id, s.last_id) {
        (Some(a), Some(b)) => format!("ids {a}..={b}"),
        _ => "no ids".to_string(),
    };
    Ok(format!(
        "{}: OK: {} records, {} bytes, {}, strictly increasing, crc32 {:#010x} (version 1)",
        file.display(),
        s.records,
        s.file_bytes,
        ids,
        s.checksum
    ))
}

/// A list's records, streamed ([`records_of`]).
pub type BoxedRecords = Box<dyn Iterator<Item = anyhow::Result<Record>>>;

/// The records of the files in order: a version 1 list.bin, or runs (parts in order).
///
/// # Errors
/// A file cannot be opened or its metadata is bad; later problems come as items.
pub fn records_of(files: &[String]) -> anyhow::Result<BoxedRecords> {
    match open_files(files, || run_records(files))? {
        OpenedList::V1(reader) => Ok(Box::new(reader.map(|r| r.map_err(anyhow::Error::from)))),
        OpenedList::Run(records) => Ok(records),
    }
}

/// [`records_of`] runs: the parts of one list in order.
fn run_records(files: &[String]) -> anyhow::Result<BoxedRecords> {
    let store = Store::new(StoreOptions::default());
    let mut runs = Vec::new();
    for f in files {
        let loc = Location::parse(f).map_err(MergeError::Store)?;
        runs.push(crate::runs::open_run(&store, &loc)?);
    }
    // Each run is read only when the one before it is done (its ranged reads are
    // bounded, so memory does not grow with the list). Within a run the blocks and the
    // index vouch for the order; across files it is checked here.
    let mut last: Option<u64> = None;
    let records = runs
        .into_iter()
        .flat_map(|run| {
            let name = run.name.clone();
            run.records(0, u64::MAX).map(move |r| (name.clone(), r))
        })
        .map(move |(name, r)| {
            let r = r.map_err(MergeError::from)?;
            if let Some(prev) = last.filter(|&p| r.id <= p) {
                let what = format!("record id {} is not above the previous file's id {prev}: the files are not the parts of one list in order (merger verify names the misplaced one)", r.id);
                return Err(MergeError::ListCheck { name, what }.into());
            }
            last = Some(r.id);
            Ok(r)
        });
    Ok(Box::new(records))
}

/// `merger cat FILE...`: every record of the files in order, one line each
/// ([`record_line`]), to `out`. A reader that closes `out` early (`| head`) is no error.
///
/// # Errors
/// A bad file (the records before the problem are written), or writing failed.
pub fn cat(files: &[String], json: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let reader = records_of(files)?;
    for item in reader {
        let r = item.with_context(|| {
            format!(
                "{} is not a valid list.bin (records above were printed)",
                files.join(" ")
            )
        })?;
        let line = record_line(&r, json);
        if let Err(e) = writeln!(out, "{line}") {
            // `merger cat | head` closes the pipe early: that is the reader's choice, not an error.
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                return Ok(());
            }
            return Err(e).context("writing to stdout");
        }
    }
    match out.flush() {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e).context("writing to stdout"),
        _ => Ok(()),
    }
}

/// One record as `merger cat` prints it: `id TAB shard TAB seq TAB payload` (payload bytes
/// escaped as ASCII), or with `json` an object with the payload as a string when it is
/// UTF-8, else as `payload_hex`.
pub fn record_line(r: &Record, json: bool) -> String {
    if json {
        let mut obj = serde_json::json!({ "id": r.id, "shard": r.shard, "seq": r.seq });
        match std::str::from_utf8(&r.payload) {
            Ok(s) => obj["payload"] = serde_json::Value::from(s),
            Err(_) => obj["payload_hex"] = serde_json::Value::from(hex(&r.payload)),
        }
        obj.to_string()
    } else {
        format!(
            "{}\t{}\t{}\t{}",
            r.id,
            r.shard,
            r.seq,
            r.payload.escape_ascii()
        )
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cat_lines_in_text_and_json() {
        let r = |payload: &[u8]| Record {
            id: 7,
            shard: 2,
            seq: 3,
            payload: payload.to_vec(),
        };
        assert_eq!(record_line(&r(b"a\tb"), false), "7\t2\t3\ta\\tb");
        let json = |line: String| -> serde_json::Value {
            serde_json::from_str(&line).expect("one JSON object")
        };
        assert_eq!(
            json(record_line(&r(b"hi"), true)),
            serde_json::json!({ "id": 7, "shard": 2, "seq": 3, "payload": "hi" })
        );
        assert_eq!(
            json(record_line(&r(b"\xff\x00"), true)),
            serde_json::json!({ "id": 7, "shard": 2, "seq": 3, "payload_hex": "ff00" })
        );
    }

    #[test]
    fn only_a_local_file_can_be_version_one() {
        let is_version_one = |file: &str| {
            matches!(
                open_files(&[file.to_string()], || Ok(())),
                Ok(OpenedList::V1(_))
            )
        };
        assert!(!is_version_one("s3://bucket/list.bin"));
        assert!(!is_version_one("/no/such/list.bin"));
    }
}
