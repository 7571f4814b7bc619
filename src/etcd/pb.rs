#![allow(clippy::all, missing_docs, dead_code)]
pub mod mvccpb { tonic::include_proto!("mvccpb"); }
pub mod authpb { tonic::include_proto!("authpb"); }
pub mod etcdserverpb { tonic::include_proto!("etcdserverpb"); }
