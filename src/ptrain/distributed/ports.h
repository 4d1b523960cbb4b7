// TCP ports for a job's rendezvous on this host.
#pragma once

namespace ptrain::distributed {

// A port no socket holds on this host right now: the kernel's pick for a bind to port 0, as torchrun
// --standalone takes one. Another process may still take it before rank 0 binds it; the run id of each
// rendezvous (ProcessGroup) keeps ranks of one job out of another's store even then.
int free_tcp_port();

// Whether a socket listens on `port` on this host (IPv4 or IPv6), so that rank 0 could not host a
// rendezvous store there. Connections left in TIME_WAIT do not count: the store binds past them.
bool tcp_port_in_use(int port);

}  // namespace ptrain::distributed
