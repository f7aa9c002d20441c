"""A free port on the loopback for the bench scripts' torch.distributed rendezvous."""
import socket


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago, for init_process_group."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
