//! Compiles the vendored etcd protos with `protox` (pure Rust, so no `protoc`
//! is needed) and generates tonic clients. Bytes fields become `bytes::Bytes`
//! so keys and values move from a watch event into a put without a copy.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["etcd/api/etcdserverpb/rpc.proto"];
    for dir in [
        "proto/etcd/api/etcdserverpb",
        "proto/etcd/api/mvccpb",
        "proto/etcd/api/authpb",
    ] {
        println!("cargo:rerun-if-changed={dir}");
    }
    let fds = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .build_server(false)
        .bytes(".")
        .compile_fds(fds)?;
    Ok(())
}
