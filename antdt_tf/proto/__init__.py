"""Generated protobuf/gRPC wire code (see tools/gen_protos.py); the .proto files are the contract."""
