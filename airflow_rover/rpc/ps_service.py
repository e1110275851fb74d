"""gRPC plumbing shared by the PS server and its clients: raw-bytes methods, bearer-token auth."""

from __future__ import annotations

SERVICE = "rover.ParameterServer"
METHODS = (
    "Pull",
    "Push",
    "PushPull",
    "InitDense",
    "Save",
    "Stats",
    "Ledger",
    "Reshard",
    "Absorb",
    "Ecrm",
)
MAX_MESSAGE_BYTES = 512 * 1024 * 1024
SERVER_THREADS = 8  # requests a PS serves at once
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]


def method_path(name: str) -> str:
    return f"/{SERVICE}/{name}"


def auth_metadata(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)
