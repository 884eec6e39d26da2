# Offline stand-in for @rules_proto: re-exports Bazel's native proto rules.
ProtoInfo = ProtoInfo
proto_lang_toolchain = native.proto_lang_toolchain
proto_library = native.proto_library
