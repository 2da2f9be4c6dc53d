"""Fire-Flyer: an open AI-HPC training infrastructure stack.

Subpackages: ``core`` (settings, errors, runtime), ``bus`` (NATS), ``rpc`` (gRPC),
``wire`` (framed TCP data plane), ``telemetry`` (OpenTelemetry), ``api`` (generated
protobuf code), ``testing`` (fixtures), ``cli`` (the ``ff`` command).
"""

__version__ = "0.1.0"
