"""Generated protobuf modules (see scripts/gen_proto.sh); do not edit by hand."""
