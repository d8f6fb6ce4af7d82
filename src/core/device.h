/* Devices: where buffers live. Ids 0..GRAFT_CPU_DEVICES-1 are the virtual CPU devices (host
 * memory); accelerator devices with their own memory follow, registered by their backends when
 * something first asks for a device past the CPUs (discovery is lazy: a program that never asks
 * never loads an accelerator runtime). A device with its own memory has memory operations; a
 * buffer on it holds the runtime's handle (a cl_mem) in exec_buffer.ptr, never a host pointer. */
#ifndef GRAFT_DEVICE_H
#define GRAFT_DEVICE_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Memory operations of a device with its own memory; each returns 0, or -1 with the error set. */
typedef struct device_mem {
  int (*alloc)(void *ctx, size_t bytes, void **handle);
  void (*free)(void *ctx, void *handle);
  int (*upload)(void *ctx, void *handle, const void *src, size_t bytes);
  int (*download)(void *ctx, const void *handle, void *dst, size_t bytes);
  int (*copy)(void *ctx, void *dst, const void *src, size_t bytes); /* device to device */
} device_mem;

typedef struct device_info {
  int id;
  const char *kind;  /* "cpu", "opencl": the backend registry's key */
  int ordinal;       /* index among the devices of its kind */
  char name[160];
  size_t memory;     /* bytes of device memory (0: host memory, not reported) */
  const device_mem *mem; /* NULL: host memory */
  void *ctx;
} device_info;

/* The device with id, or NULL when there is none (ids past the CPUs run discovery once). */
const device_info *device_get(int id);
/* True when id is a device (see device_get). */
bool device_valid(int id);
/* True when buffers on id are host memory (the CPU devices). */
bool device_is_host(int id);
/* The device's kind ("cpu" for an invalid id: callers check validity first). */
const char *device_kind(int id);
/* Devices known (runs discovery). */
int device_count(void);
/* Devices known so far, without running discovery (reports). */
int device_count_known(void);
/* Registers a device with its own memory (discovery only); returns its id or -1 (table full). */
int device_register(const char *kind, const char *name, size_t memory, const device_mem *mem,
                    void *ctx);
/* Discovery records why a kind it looks for lists no device ("no CUDA driver: ..."); the last
 * word per kind wins. device_absent runs discovery and returns that text, or NULL when the kind
 * has a device or was never looked for. */
void device_note_absent(const char *kind, const char *why);
const char *device_absent(const char *kind);
/* Runs the accelerator backends' discovery (defined in src/backends/builtin.c, like
 * backend_register_builtin: an explicit call from here, once). */
void device_discover_builtin(void);
/* Writes "opencl:0 (pocl ...)" style text naming id into buf. */
const char *device_str(int id, char *buf, size_t n);
/* One line listing every device, for error messages ("0..3 cpu, 4 opencl:0 (...)"). */
const char *device_list_str(char *buf, size_t n);

/* Counters of data crossing a device-memory boundary (uploads to and downloads from devices
 * with their own memory; fallbacks' transfers included); atomic, any thread. */
typedef struct {
  uint64_t uploads, upload_bytes, downloads, download_bytes;
} device_traffic;
void device_count_upload(size_t bytes);
void device_count_download(size_t bytes);
void device_traffic_get(device_traffic *out);
void device_traffic_reset(void);
#endif
