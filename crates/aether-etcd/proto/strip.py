#!/usr/bin/env python3
"""Strip etcd's protos down to what a plain protobuf compiler needs.

Usage: proto/strip.py <etcd-checkout> [<out-dir>]

Reads api/{etcdserverpb/rpc.proto,mvccpb/kv.proto,authpb/auth.proto} from an
etcd source tree and writes them under <out-dir>/etcd/api/... (default: the
directory holding this script). Only annotations are removed:

  * `import "gogoproto/gogo.proto";` and `option (gogoproto.*) = ...;`
  * `import "google/api/annotations.proto";` and the
    `option (google.api.http) = { ... };` blocks on RPCs
  * `import "protoc-gen-openapiv2/..."` and `option (grpc.gateway...)` blocks
  * field options of the form `[(gogoproto.*) = ...]`

Messages, fields, comments and field numbers are left exactly as upstream.
"""
import pathlib
import re
import sys

FILES = ["etcdserverpb/rpc.proto", "mvccpb/kv.proto", "authpb/auth.proto"]
ANNOTATED_IMPORT = re.compile(r'^import "(gogoproto|google/api|protoc-gen-openapiv2)/')
FILE_OPTION = re.compile(r"^\s*option \((gogoproto|grpc\.gateway)[^;]*;\s*$")
BLOCK_OPTION = re.compile(r"^\s*option \((google\.api\.http|grpc\.gateway[^)]*)\) = \{")
FIELD_OPTION = re.compile(r"\s*\[\(gogoproto\.[^\]]*\]")


def strip(text: str) -> str:
    out, depth = [], 0
    for line in text.splitlines():
        if depth:
            depth += line.count("{") - line.count("}")
            continue
        if BLOCK_OPTION.match(line):
            depth = line.count("{") - line.count("}")
            continue
        if ANNOTATED_IMPORT.match(line) or FILE_OPTION.match(line):
            continue
        if line.strip() == "// for grpc-gateway":
            continue
        out.append(FIELD_OPTION.sub("", line))
    # Collapse the blank runs left where imports and options were.
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).rstrip() + "\n"


def main() -> None:
    src = pathlib.Path(sys.argv[1]) / "api"
    dst = pathlib.Path(sys.argv[2] if len(sys.argv) > 2 else pathlib.Path(__file__).parent)
    for name in FILES:
        target = dst / "etcd" / "api" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(strip((src / name).read_text()))
        print(f"wrote {target}")


if __name__ == "__main__":
    main()
