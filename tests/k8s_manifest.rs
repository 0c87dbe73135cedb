//! docs/k8s/merge-job.yaml, the README's Kubernetes Indexed Job, against Kubernetes' own
//! schemas: `kubernetes-validate --strict` (PyPI, pip-installed by `scripts/deps.sh` into
//! the venv `QLIST_PY`, default /var/tmp/qlist-py), which ships the schemas and needs no
//! cluster and no network. A missing validator fails the test: it never skips.

use std::path::{Path, PathBuf};
use std::process::Command;

fn validator() -> PathBuf {
    let py = std::env::var_os("QLIST_PY").unwrap_or_else(|| "/var/tmp/qlist-py".into());
    let path = Path::new(&py).join("bin/kubernetes-validate");
    assert!(
        path.is_file(),
        "{} is missing: `bash scripts/deps.sh` pip-installs kubernetes-validate into that venv",
        path.display()
    );
    path
}

fn validate(manifest: &Path) -> std::process::Output {
    Command::new(validator())
        .arg("--strict")
        .arg(manifest)
        .output()
        .expect("run kubernetes-validate")
}

#[test]
fn merge_job_manifest_is_a_valid_indexed_job() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = root.join("docs/k8s/merge-job.yaml");
    let body = std::fs::read_to_string(&manifest).expect("read the manifest");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("read README.md");
    assert!(
        readme.contains(&body),
        "README.md must show docs/k8s/merge-job.yaml exactly as the file has it"
    );
    let out = validate(&manifest);
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("passed"),
        "kubernetes-validate refused {}: {}",
        manifest.display(),
        testkit::printed(&out)
    );
    assert!(
        body.contains("completionMode: Indexed"),
        "not an Indexed Job"
    );

    // The check can fail: a misspelt field is refused, so a pass above means something.
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, body.replace("parallelism:", "paralelism:")).expect("write");
    let out = validate(&bad);
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stdout).contains("paralelism"),
        "kubernetes-validate passed a misspelt field: {}",
        testkit::printed(&out)
    );
}
