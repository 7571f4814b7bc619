//! Records the git revision for `aether_replicator_build_info` in
//! `AETHER_REPLICATOR_REVISION`: the variable itself if the build sets it to
//! something other than blanks (the Containerfile's `REVISION` build argument:
//! an image is built without `.git`), else `git rev-parse --short HEAD` of this
//! checkout, else "unknown" (no git, or a crate tarball, possibly unpacked
//! inside some other repository), which must not fail the build.

fn main() {
    revision();
}

fn revision() {
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
        return;
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
        return;
    }
    // Rebuild when HEAD moves: a commit changes the branch's ref (loose or
    // packed), a checkout changes HEAD itself.
    for path in ["HEAD", "packed-refs"] {
        if let Some(p) = git(&["rev-parse", "--git-path", path]) {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    if let Some(p) =
        git(&["symbolic-ref", "-q", "HEAD"]).and_then(|r| git(&["rev-parse", "--git-path", &r]))
    {
        println!("cargo:rerun-if-changed={p}");
    }
}
