//! Records the git revision for `aether_replicator_build_info` in
//! `AETHER_REPLICATOR_REVISION`: the variable itself if the build sets it to
//! something other than blanks (the Containerfile's `REVISION` build argument:
//! an image is built without `.git`), else `git rev-parse --short HEAD` of this
//! checkout, else "unknown" (no git, or a crate tarball, possibly unpacked
//! inside some other repository), which must not fail the build.
//!
//! Records the build date for `--version` in `AETHER_REPLICATOR_BUILD_DATE`
//! (UTC, `YYYY-MM-DD`): from `SOURCE_DATE_EPOCH` when set, so that a
//! reproducible build stays reproducible, else the day the build script ran.

fn main() {
    let revision = revision();
    let date = build_date();
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    println!(
        "cargo:rustc-env=AETHER_REPLICATOR_LONG_VERSION={version} (rev {revision}, built {date})"
    );
}

fn build_date() -> String {
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");
    let secs = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        });
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let date = format!("{y:04}-{m:02}-{d:02}");
    println!("cargo:rustc-env=AETHER_REPLICATOR_BUILD_DATE={date}");
    date
}

/// The proleptic Gregorian date of `days` since 1970-01-01 (Howard
/// Hinnant's `civil_from_days`), so that the build needs no date crate.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

fn revision() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    };
    println!("cargo:rerun-if-env-changed=AETHER_REPLICATOR_REVISION");
    // An explicit revision wins over git. Empty counts as unset: the
    // Containerfile passes its `REVISION` argument, empty unless given.
    let explicit = std::env::var("AETHER_REPLICATOR_REVISION")
        .ok()
        .map(|r| r.trim().to_string())
        .filter(|r| !r.is_empty());
    if let Some(revision) = explicit {
        println!("cargo:rustc-env=AETHER_REPLICATOR_REVISION={revision}");
        return revision;
    }
    // Only this package's own checkout (`.git` is a directory, or a file in
    // a worktree), never an enclosing repository's HEAD.
    let own_checkout =
        std::path::Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default())
            .join(".git")
            .exists();
    let revision = own_checkout
        .then(|| git(&["rev-parse", "--short", "HEAD"]))
        .flatten()
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=AETHER_REPLICATOR_REVISION={revision}");
    if !own_checkout {
        return revision;
    }
    // Rebuild when HEAD moves: a commit changes the branch's ref (loose or
    // packed), a checkout changes HEAD itself. Only files that exist: cargo
    // counts a missing one as changed, and would rebuild this crate and
    // relink every test on every run (a checkout without `packed-refs`).
    let branch = git(&["symbolic-ref", "-q", "HEAD"]);
    let watched = ["HEAD", "packed-refs"]
        .into_iter()
        .map(String::from)
        .chain(branch)
        .filter_map(|path| git(&["rev-parse", "--git-path", &path]))
        .filter(|p| std::path::Path::new(p).exists());
    for p in watched {
        println!("cargo:rerun-if-changed={p}");
    }
    revision
}
