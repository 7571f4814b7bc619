//! Least privilege: a role that may read one prefix, a user holding it,
//! and what a cluster with auth enabled answers that user and a client
//! without credentials.
//!
//! Run it against a throwaway etcd: it enables auth (which needs a `root`
//! user, so it makes one), then disables auth again and deletes what it
//! made.
//!
//! ```sh
//! cargo run -p aether-etcd --example auth -- http://127.0.0.1:2379
//! ```

use aether_etcd::{Client, ClientConfig, Error, Permission, Put, Range};

const PREFIX: &str = "/examples/auth/app/";
const CONFIG: &str = "/examples/auth/app/config";
const ROOT_PASSWORD: &str = "example-root-password";
const APP_PASSWORD: &str = "example-app-password";

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

#[tokio::main]
async fn main() -> Result<()> {
    let endpoint = std::env::args()
        .nth(1)
        .unwrap_or("http://127.0.0.1:2379".into());
    // Auth is off: any client may set it up.
    let admin = Client::connect(ClientConfig::new([endpoint.clone()]))?;
    admin.put(Put::new(CONFIG, "v1")).await?;
    admin.role_add("app-reader").await?;
    admin
        .role_grant_permission("app-reader", &Permission::read(PREFIX).with_prefix())
        .await?;
    admin.user_add("app", APP_PASSWORD).await?;
    admin.user_grant_role("app", "app-reader").await?;
    admin.user_add("root", ROOT_PASSWORD).await?;
    admin.user_grant_role("root", "root").await?;
    admin.auth_enable().await?;
    println!("auth enabled: user app may read {PREFIX}*");

    let app = Client::connect(
        ClientConfig::new([endpoint.clone()]).with_credentials("app", APP_PASSWORD),
    )?;
    let read = app.range(Range::key(CONFIG)).await?;
    let value = String::from_utf8_lossy(read.kvs()[0].value()).into_owned();
    println!("app reads {CONFIG} = {value}");
    match app.put(Put::new(CONFIG, "v2")).await {
        Err(Error::PermissionDenied) => println!("app may not write it: permission denied"),
        other => return Err(format!("a write by app: {other:?}").into()),
    }
    match app.range(Range::key("/examples/auth/other")).await {
        Err(Error::PermissionDenied) => println!("app may not read outside {PREFIX}"),
        other => return Err(format!("a read outside the prefix: {other:?}").into()),
    }
    match admin.range(Range::key(CONFIG)).await {
        Err(Error::Auth(_)) => println!("a client without credentials is refused"),
        other => return Err(format!("a read without credentials: {other:?}").into()),
    }

    // Back as it was: auth off, then nothing of this example left.
    let root =
        Client::connect(ClientConfig::new([endpoint]).with_credentials("root", ROOT_PASSWORD))?;
    root.auth_disable().await?;
    admin.user_delete("app").await?;
    admin.user_delete("root").await?;
    admin.role_delete("app-reader").await?;
    println!("auth disabled; users app and root and role app-reader deleted");
    Ok(())
}
