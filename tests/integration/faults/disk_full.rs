//! SQLite's disk full mid-stream (issue 27): the database lives on a small
//! tmpfs of its own, a filler file takes every free block while the host
//! is working, and the host must say so in the database's own words, keep
//! running without parking or losing anything, and resume exactly once
//! when the space comes back.

use crate::support::*;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// What SQLite says when a write finds no free block (`SQLITE_FULL`).
const DISK_FULL: &str = "database or disk is full";

/// A tmpfs mounted for one test, unmounted when dropped. Needs root, which
/// the test machines and CI have; a machine without it fails the test with
/// the reason rather than pass it untried.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(size_mib: u32) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mib}m"), "tmpfs"])
            .arg(dir.path())
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "this test mounts a small tmpfs to fill (it runs as root on the test machines): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a file that takes every free block; returns its path.
    fn fill(&self) -> PathBuf {
        let path = self.path().join("filler");
        let mut file = std::fs::File::create(&path).expect("create the filler");
        let chunk = vec![0x5a_u8; 64 * 1024];
        // Bounded: the disk is a few MiB, and ENOSPC ends the loop long before.
        for _ in 0..100_000 {
            if file.write_all(&chunk).is_err() {
                break;
            }
        }
        // The last partial chunk: byte by byte is too slow, 4 KiB pages suffice.
        for _ in 0..16 {
            if file.write_all(&chunk[..4096]).is_err() {
                break;
            }
        }
        let _ = file.sync_all();
        path
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        // Lazy: a host that still holds the database open must not keep
        // the tmpfs (and the test's folder) mounted.
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

/// The disk fills while orders keep coming: a clear error, the host up,
/// no dead letter; the filler goes and every order is applied once, with
/// one outbox message each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_disk_full_is_a_clear_error_and_recovers_when_space_returns() {
    let topic = unique("orders");
    create_topic(&topic, 3).await;
    let disk = SmallDisk::mount(24);
    let db_url = format!("sqlite://{}", disk.path().join("inboxd.sqlite").display());
    // Sent messages are kept (not deleted as sent), so the test can count them.
    let keep = "[outbox]\nretention = \"1d\"\n";
    let env = TestEnv::with_database(tempfile::tempdir().unwrap(), db_url, "billing", &topic, keep);
    let initial = 1_000;
    let mut ends = produce(&topic, &orders_with_duplicates(initial, 5)).await;
    let mut host = env.spawn_host();
    let started = wait_for_progress(&env, &topic, 100).await;
    assert!(started, "no progress before the disk filled:\n{}", host.log());

    let filler = disk.fill();
    // Orders past anything the database's free pages can hold.
    let more = 4_000;
    merge_ends(&mut ends, produce(&topic, &orders_with_duplicates(more, 5)).await);
    let said = poll_until(Duration::from_secs(60), || async {
        host.log().contains(DISK_FULL)
    })
    .await;
    assert!(said, "the host never reported the full disk:\n{}", host.log());
    // It waits the disk out: up, and nothing parked for it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        host.is_running(),
        "the host must survive a full disk:\n{}",
        host.log()
    );

    std::fs::remove_file(&filler).expect("remove the filler");
    env.wait_for_offsets(&ends, Duration::from_secs(180), &mut host)
        .await;
    assert!(
        host.log().contains("database is back"),
        "the host never said the outage ended:\n{}",
        host.log()
    );
    assert_eq!(host.terminate(Duration::from_secs(30)).await, Some(0));
    let unique_events = initial + more;
    env.assert_exactly_once("invoices", unique_events, &ends).await;
    let db = env.db().await;
    let messages = count(&db, "SELECT COUNT(*) FROM outbox WHERE handler = 'billing'").await;
    assert_eq!(messages as usize, unique_events, "one outbox message per invoice");
    let dead = count(&db, "SELECT COUNT(*) FROM dead_letters").await;
    assert_eq!(
        dead,
        0,
        "no event parked for the host's full disk:\n{}",
        host.log()
    );
}
