"""An OTLP/gRPC trace receiver that counts what it is sent and keeps nothing: the far end of
`quorum bench submit` with tracing on (benches/RESULTS.md, "The cost of tracing").

Usage: PY=$(scripts/pypi-venv.sh opentelemetry-proto 1.27.0 opentelemetry.proto); $PY -m pip install grpcio
       $PY benches/otlp-sink.py 127.0.0.1:4317     # prints the spans received when stopped (Ctrl-C)
"""

import signal
import sys
import threading
from concurrent import futures

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

received = {"spans": 0, "requests": 0}
lock = threading.Lock()


class Sink(trace_service_pb2_grpc.TraceServiceServicer):
    def Export(self, request, context):
        spans = sum(len(scope.spans) for rs in request.resource_spans for scope in rs.scope_spans)
        with lock:
            received["spans"] += spans
            received["requests"] += 1
        return trace_service_pb2.ExportTraceServiceResponse()


server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), options=[("grpc.max_receive_message_length", 64 << 20)])
trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Sink(), server)
server.add_insecure_port(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:4317")
server.start()
stop = threading.Event()
signal.signal(signal.SIGINT, lambda *_: stop.set())
signal.signal(signal.SIGTERM, lambda *_: stop.set())
stop.wait()
server.stop(1)
print(f"received {received['spans']} spans in {received['requests']} requests", flush=True)
