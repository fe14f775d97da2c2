"""The API through Python's official gRPC client (`grpcio`), a counterpart
nobody here wrote: compiles the repo's protos with `grpc_tools.protoc`,
calls the server at argv[1] (plaintext, no API key) and prints one JSON
object per line, `{"check": name, ...observations}`, for
tests/api/interop.rs to assert on. Expected gRPC errors are observations;
only an unexpected exception makes it exit non-zero."""

import importlib
import json
import pathlib
import sys
import tempfile

import grpc
from google.protobuf import json_format
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from grpc_tools import protoc

PROTO_DIR = pathlib.Path(__file__).resolve().parents[2] / "proto"
PACKAGE = "ai.orchestrator.v1"


def compile_protos(out):
    """Generates `*_pb2.py` and `*_pb2_grpc.py` for every proto into `out`."""
    # grpc_tools ships the well-known types (google/protobuf/*.proto).
    well_known = pathlib.Path(protoc.__file__).parent / "_proto"
    files = sorted(str(p) for p in PROTO_DIR.glob("ai/orchestrator/v1/*.proto"))
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_DIR}",
        f"-I{well_known}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        *files,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {args}")
    sys.path.insert(0, out)


def module(name):
    return importlib.import_module(f"{PACKAGE}.{name}")


def emit(check, **observed):
    print(json.dumps({"check": check, **observed}), flush=True)


def trace_header(call):
    """`x-trace-id` from the call's initial, else trailing, metadata."""
    for md in (call.initial_metadata() or (), call.trailing_metadata() or ()):
        for key, value in md:
            if key == "x-trace-id":
                return value
    return None


def ctx(pb, trace_id=""):
    return pb.RequestContext(team_id="t1", trace_id=trace_id)


def classify_sms(channel, pb, pbg):
    stub = pbg.OrchestratorStub(channel)
    request = pb.ClassifySmsRequest(context=ctx(pb), message="Yes, call me tomorrow")
    response, call = stub.ClassifySms.with_call(
        request, metadata=[("x-trace-id", "py-interop-1")], timeout=30
    )
    emit(
        "classify_sms",
        intent=pb.SmsIntent.Name(response.intent),
        needs_review=response.needs_review,
        meta_trace_id=response.meta.trace_id,
        header_trace_id=trace_header(call),
    )


def error_infos(e):
    """The google.rpc.ErrorInfo details of a failed call's rich status."""
    status = rpc_status.from_call(e)
    infos = []
    for detail in status.details if status else ():
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            infos.append(info)
    return infos


def emit_error(check, e):
    """What a failed call said: its code, its one ErrorInfo and the trace
    ID in the ErrorInfo and in the response metadata."""
    infos = error_infos(e)
    info = infos[0] if len(infos) == 1 else None
    emit(
        check,
        code=e.code().name,
        error_infos=len(infos),
        reason=info and info.reason,
        domain=info and info.domain,
        trace_id=info and info.metadata.get("trace_id"),
        header_trace_id=trace_header(e),
    )


def unknown_task(channel, pb, pbg):
    stub = pbg.OrchestratorStub(channel)
    request = pb.ExecuteRequest(
        context=ctx(pb, "py-interop-2"), task="no_such_task", input_json="{}"
    )
    try:
        stub.Execute(request, timeout=30)
    except grpc.RpcError as e:
        emit_error("unknown_task", e)
    else:
        emit("unknown_task", code="OK")


def execute_stream(channel, pb, pbg):
    stub = pbg.OrchestratorStub(channel)
    request = pb.ExecuteRequest(context=ctx(pb, "py-interop-3"), task="meeting_brief")
    request.input_struct.update({"attendees": ["Ana"], "topic": "renewal"})
    kinds, deltas, completed = [], [], None
    for event in stub.ExecuteStream(request, timeout=30):
        kind = event.WhichOneof("event")
        kinds.append(kind)
        if kind == "delta":
            deltas.append(event.delta.text)
        elif kind == "completed":
            completed = event.completed
    emit(
        "execute_stream",
        kinds=kinds,
        text_len=len(completed.text) if completed else None,
        deltas_are_text=completed is not None and "".join(deltas) == completed.text,
        trace_id=completed.meta.trace_id if completed else None,
    )


def invoke_echo(channel, pb, tpb, tpbg):
    stub = tpbg.ToolServiceStub(channel)
    request = tpb.InvokeToolRequest(context=ctx(pb, "py-interop-4"), tool="system.echo")
    request.input.update({"text": "hi from python"})
    response = stub.InvokeTool(request, timeout=30)
    invocation = response.invocation
    emit(
        "invoke_echo",
        status=tpb.InvocationStatus.Name(invocation.status),
        output=json_format.MessageToDict(invocation.output),
        tool=invocation.tool,
    )


def converse(channel, pb, apb, apbg):
    stub = apbg.AgentServiceStub(channel)
    request = apb.ConverseRequest(
        context=ctx(pb, "py-interop-5"), agent="assistant", message="Say hello"
    )
    kinds, started, completed, tools = [], None, None, []
    for event in stub.Converse(request, timeout=30):
        kind = event.WhichOneof("event")
        kinds.append(kind)
        if kind == "started":
            started = event.started
        elif kind == "tool_result":
            tools.append([event.tool_result.tool, event.tool_result.status])
        elif kind == "completed":
            completed = event.completed
    emit(
        "converse",
        kinds=kinds,
        stop_reason=apb.StopReason.Name(completed.stop_reason) if completed else None,
        conversation_id_set=bool(started and started.conversation_id),
        trace_id=started.trace_id if started else None,
        tool_results=tools,
    )


def short_deadline(channel, pb, pbg):
    # The mock provider answers after 20 ms; the request's budget is 1 ms.
    # The client waits 30 s: the DEADLINE_EXCEEDED is the server's, with its
    # ErrorInfo, not grpcio's own timer.
    stub = pbg.OrchestratorStub(channel)
    request = pb.ClassifySmsRequest(
        context=ctx(pb, "py-interop-6"),
        message="Yes, call me tomorrow",
        budget=pb.Budget(max_latency_ms=1),
    )
    try:
        stub.ClassifySms(request, timeout=30)
    except grpc.RpcError as e:
        emit_error("short_deadline", e)
    else:
        emit("short_deadline", code="OK")


def main():
    address = sys.argv[1]
    with tempfile.TemporaryDirectory() as out:
        compile_protos(out)
        pb, pbg = module("orchestrator_pb2"), module("orchestrator_pb2_grpc")
        tpb, tpbg = module("tools_pb2"), module("tools_pb2_grpc")
        apb, apbg = module("agent_pb2"), module("agent_pb2_grpc")
        # A proxy named in the environment must not carry a loopback call.
        options = [("grpc.enable_http_proxy", 0)]
        with grpc.insecure_channel(address, options=options) as channel:
            grpc.channel_ready_future(channel).result(timeout=30)
            classify_sms(channel, pb, pbg)
            unknown_task(channel, pb, pbg)
            execute_stream(channel, pb, pbg)
            invoke_echo(channel, pb, tpb, tpbg)
            converse(channel, pb, apb, apbg)
            short_deadline(channel, pb, pbg)


if __name__ == "__main__":
    main()
