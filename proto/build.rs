/// The public API's messages are also the REST API's resources: they read and write as JSON
/// (serde, every field optional as in protobuf, an unknown field refused) and describe themselves
/// for its OpenAPI document.
const REST_MESSAGE: &str =
    "#[derive(serde::Serialize, serde::Deserialize, utoipa::ToSchema)] #[serde(default, deny_unknown_fields)]";
const REST_ENUM: &str = "#[derive(serde::Serialize, serde::Deserialize, utoipa::ToSchema)]";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tonic_prost_build::configure()
        .message_attribute(".quorum.api", REST_MESSAGE)
        .enum_attribute(".quorum.api", REST_ENUM)
        // A submit without a spec is refused; its document says the spec is required.
        .field_attribute(".quorum.api.SubmitJobRequest.spec", "#[schema(required = true, value_type = JobSpec)]")
        .compile_protos(&["proto/api.proto", "proto/agent.proto", "proto/raft.proto"], &["proto"])?;
    Ok(())
}
