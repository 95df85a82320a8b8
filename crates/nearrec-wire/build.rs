//! Generates the nearrec.v1 messages, server and client from `proto/nearrec/v1/*.proto`, and the
//! Open Inference Protocol's from `proto/inference/grpc_predict_v2.proto`, and keeps the encoded
//! descriptor set of both for server reflection.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let files = ["nearrec/v1/node.proto", "inference/grpc_predict_v2.proto"];
    for f in &files {
        println!("cargo:rerun-if-changed={}", root.join(f).display());
    }
    let fds = protox::compile(files, [&root])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("nearrec_v1_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    // requests that do not decode are INVALID_ARGUMENT (src/codec.rs)
    tonic_prost_build::configure()
        .bytes(".")
        .codec_path("crate::codec::NodeCodec")
        .compile_fds(fds)?;
    Ok(())
}
