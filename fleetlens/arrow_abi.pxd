# The Arrow C data and stream interfaces (arrow.apache.org/docs/format/CDataInterface.html and
# CStreamInterface.html) and its bitmaps' bit read, declared once for the modules that read
# Arrow memory in place (fleetlens/_batchscan.pyx, fleetlens/_strindex.pyx, sync/_csr.pyx). The
# C text is the specification's, behind its guards, so a translation unit that also includes
# Arrow's own header compiles.
from libc.stdint cimport int64_t, uint8_t


cdef extern from *:
    """
    #ifndef ARROW_C_DATA_INTERFACE
    #define ARROW_C_DATA_INTERFACE
    struct ArrowSchema {
      const char* format;
      const char* name;
      const char* metadata;
      int64_t flags;
      int64_t n_children;
      struct ArrowSchema** children;
      struct ArrowSchema* dictionary;
      void (*release)(struct ArrowSchema*);
      void* private_data;
    };
    struct ArrowArray {
      int64_t length;
      int64_t null_count;
      int64_t offset;
      int64_t n_buffers;
      int64_t n_children;
      const void** buffers;
      struct ArrowArray** children;
      struct ArrowArray* dictionary;
      void (*release)(struct ArrowArray*);
      void* private_data;
    };
    #endif
    #ifndef ARROW_C_STREAM_INTERFACE
    #define ARROW_C_STREAM_INTERFACE
    struct ArrowArrayStream {
      int (*get_schema)(struct ArrowArrayStream*, struct ArrowSchema* out);
      int (*get_next)(struct ArrowArrayStream*, struct ArrowArray* out);
      const char* (*get_last_error)(struct ArrowArrayStream*);
      void (*release)(struct ArrowArrayStream*);
      void* private_data;
    };
    #endif
    """
    struct ArrowArray:
        int64_t length
        int64_t null_count
        int64_t offset
        int64_t n_buffers
        int64_t n_children
        const void **buffers
        ArrowArray **children
        void (*release)(ArrowArray *) noexcept nogil

    struct ArrowArrayStream:
        int (*get_next)(ArrowArrayStream *, ArrowArray *) noexcept nogil
        const char *(*get_last_error)(ArrowArrayStream *) noexcept nogil


cdef inline bint bit_set(const uint8_t* bits, int64_t i) noexcept nogil:
    """Bit ``i`` of an Arrow bitmap, least significant bit first (validity: value ``i`` is
    not null)."""
    return (bits[i >> 3] >> (i & 7)) & 1
