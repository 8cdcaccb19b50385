//! Compiles the rendezvous `.proto` file with tonic 0.14 into OUT_DIR, and
//! the descriptor sets the servers' gRPC reflection serves: the rendezvous'
//! and the Flight service's (`proto/flight.proto`, described only: its code
//! is arrow-flight's).
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/rendezvous.proto", "proto/flight.proto"];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        // All-gather payloads are shared by every member's reply: no copies.
        .bytes(".kindling.rendezvous.v1.AllGatherRequest.payload")
        .bytes(".kindling.rendezvous.v1.AllGatherResponse.payloads")
        .file_descriptor_set_path(out.join("rendezvous_descriptor.bin"))
        .compile_protos(&["proto/rendezvous.proto"], &["proto"])?;
    // Messages only (never included): what reflection needs is the descriptor.
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(false)
        .file_descriptor_set_path(out.join("flight_descriptor.bin"))
        .compile_protos(&["proto/flight.proto"], &["proto"])?;
    Ok(())
}
