"""Host probe agent: NIC discovery, probe plan, Cython fast path, windows, upload."""
