"""How the server's gRPC services are registered: requests are parsed where we can answer.

grpcio parses a request before any servicer code runs and answers one it cannot parse (a
truncated or random-bytes message) with INTERNAL "Exception deserializing request!", logging a
traceback as if the server were broken. A malformed request is the client's error, so every
method is registered here with a parser that never raises: what does not parse reaches the
method as `Malformed`, and the call ends with INVALID_ARGUMENT saying which message it was. A
streaming request raises `MalformedRequest` from the request iterator, where the servicer reads
the client's messages and reports a broken stream with its own status.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message import Message

from sparkbeam.errors import SparkBeamError

_FACTORIES = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


class MalformedRequest(SparkBeamError):
    """A request message of a stream could not be parsed."""


@dataclass(frozen=True)
class Malformed:
    """A request that did not parse: which message type was expected, and why it failed."""

    expected: str
    size: int
    error: str

    def describe(self, method: str) -> str:
        return (
            f"{method}: the request is not a valid {self.expected} ({self.size} bytes: "
            f"{self.error}); is the client speaking Beam's Job API?"
        )


def add_service(server: grpc.Server, service: ServiceDescriptor, servicer: Any) -> None:
    """Registers every method of `service` that `servicer` implements, parsing safely."""
    handlers = {}
    for method in service.methods:
        behaviour = getattr(servicer, method.name, None)
        if behaviour is None:
            continue
        request_class = message_factory.GetMessageClass(method.input_type)
        response_class = message_factory.GetMessageClass(method.output_type)
        kind = (method.client_streaming, method.server_streaming)
        handlers[method.name] = _FACTORIES[kind](
            _guarded(behaviour, method),
            request_deserializer=_parser(request_class),
            response_serializer=response_class.SerializeToString,
        )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),)
    )


def _parser(request_class: type[Message]) -> Callable[[bytes], Message | Malformed]:
    def parse(data: bytes) -> Message | Malformed:
        try:
            return request_class.FromString(data)
        except Exception as exc:  # noqa: BLE001 - any parse failure is the client's bad input
            return Malformed(request_class.DESCRIPTOR.full_name, len(data),
                             f"{type(exc).__name__}: {exc}")

    return parse


def _guarded(behaviour: Callable[..., Any], method: MethodDescriptor) -> Callable[..., Any]:
    if method.client_streaming:
        def streaming(requests: Iterator[Any], context: Any) -> Any:
            return behaviour(_checked(requests, method.name), context)

        return streaming

    def unary(request: Any, context: Any) -> Any:
        if isinstance(request, Malformed):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.describe(method.name))
        return behaviour(request, context)

    return unary


def _checked(requests: Iterator[Any], method: str) -> Iterator[Any]:
    for request in requests:
        if isinstance(request, Malformed):
            raise MalformedRequest(request.describe(method))
        yield request
