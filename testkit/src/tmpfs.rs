//! A sized tmpfs for the tests that fill a disk: mounted on a fresh directory, unmounted
//! on drop. Needs root (or CAP_SYS_ADMIN), as CI has; without it the test fails saying so.

use std::path::PathBuf;
use std::process::Command;

/// A sized tmpfs mounted on a fresh directory, unmounted (lazily, so open files of
/// killed processes cannot block it) and removed on drop. Needs root, as CI has.
pub struct Tmpfs {
    /// The mount point.
    pub dir: PathBuf,
    _parent: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounts a tmpfs of `bytes` bytes.
    ///
    /// # Panics
    /// If mount(8) fails: the message says the test needs root.
    pub fn mount(bytes: u64) -> Tmpfs {
        let parent = tempfile::tempdir().expect("tempdir for the tmpfs mount point");
        let dir = parent.path().join("fs");
        std::fs::create_dir(&dir).expect("create the mount point");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(&dir)
            .output()
            .expect("run mount(8)");
        assert!(
            out.status.success(),
            "this test mounts a {bytes}-byte tmpfs to fill a disk and needs root (or CAP_SYS_ADMIN) for it: `mount -t tmpfs` failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs {
            dir,
            _parent: parent,
        }
    }

    /// Changes the filesystem's size (more space returns at once).
    ///
    /// # Panics
    /// If the remount fails.
    pub fn resize(&self, bytes: u64) {
        let out = Command::new("mount")
            .args(["-o", &format!("remount,size={bytes}")])
            .arg(&self.dir)
            .output()
            .expect("run mount(8)");
        assert!(
            out.status.success(),
            "remount tmpfs: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Fills the filesystem up with a filler file; returns its path (delete it to free
    /// the space).
    ///
    /// # Panics
    /// On a write error other than ENOSPC.
    pub fn fill(&self) -> PathBuf {
        use std::io::Write;
        let path = self.dir.join("filler");
        let mut f = std::fs::File::create(&path).expect("create filler");
        let chunk = vec![0xa5u8; 64 * 1024];
        loop {
            match f.write(&chunk) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling {}: {e}", path.display()),
            }
        }
        // Byte-level fill of the last partial block.
        while let Ok(n) = f.write(&chunk[..1]) {
            if n == 0 {
                break;
            }
        }
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}
