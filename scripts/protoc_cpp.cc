// A protoc with the C++ generator only, built by scripts/build_protobuf.py from the same protobuf
// sources as the runtime it generates for (grpcio-tools' own protoc registers Python generators
// only). Usage is protoc's: protoc_cpp --proto_path=DIR --cpp_out=DIR FILE.proto
#include "google/protobuf/compiler/command_line_interface.h"
#include "google/protobuf/compiler/cpp/generator.h"

int main(int argc, char* argv[]) {
  google::protobuf::compiler::CommandLineInterface cli;
  google::protobuf::compiler::cpp::CppGenerator cpp;
  cli.RegisterGenerator("--cpp_out", &cpp, "Generate C++ header and source.");
  return cli.Run(argc, argv);
}
