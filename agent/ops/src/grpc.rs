//! The standard gRPC services every Kindling server serves beside its own:
//! server reflection (`tonic-reflection`, v1 and the older v1alpha that some
//! tools still ask first), so `grpcurl list` / `describe` and other standard
//! tools discover the health service, reflection itself and the server's own
//! service from the server alone. Like the health service they answer
//! without a token: they describe public protocols and hold no job's data.

use tonic_reflection::server::{Builder, Error, v1, v1alpha};

/// Reflection over the health service, reflection itself and `own` (an
/// encoded descriptor set: `kindling_schemas::pb::FLIGHT_FILE_DESCRIPTOR_SET`
/// on the agent, `kindling_schemas::pb::rendezvous::FILE_DESCRIPTOR_SET` on
/// the rendezvous), as the v1 and the v1alpha service.
#[allow(clippy::type_complexity)]
pub fn reflection(
    own: &'static [u8],
) -> Result<
    (
        v1::ServerReflectionServer<impl v1::ServerReflection>,
        v1alpha::ServerReflectionServer<impl v1alpha::ServerReflection>,
    ),
    Error,
> {
    let builder = || {
        Builder::configure()
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(own)
    };
    Ok((builder().build_v1()?, builder().build_v1alpha()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_servers_descriptor_sets_decode() {
        for own in [
            kindling_schemas::pb::FLIGHT_FILE_DESCRIPTOR_SET,
            kindling_schemas::pb::rendezvous::FILE_DESCRIPTOR_SET,
        ] {
            reflection(own).expect("descriptor set");
        }
    }
}
