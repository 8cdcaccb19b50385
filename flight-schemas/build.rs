//! Compiles the rendezvous `.proto` file with tonic 0.14 into OUT_DIR.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/rendezvous.proto"];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    tonic_prost_build::configure()
        // All-gather payloads are shared by every member's reply: no copies.
        .bytes(".kindling.rendezvous.v1.AllGatherRequest.payload")
        .bytes(".kindling.rendezvous.v1.AllGatherResponse.payloads")
        .compile_protos(&protos, &["proto"])?;
    Ok(())
}
