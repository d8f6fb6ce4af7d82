/* The device table (device.h). */
#include "device.h"
#include "graft.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

static device_info devices[GRAFT_MAX_DEVICES];
static int ndevices; /* accelerators registered (ids GRAFT_CPU_DEVICES..) */
static pthread_once_t discover_once = PTHREAD_ONCE_INIT;

static void device_discover(void) { device_discover_builtin(); }

static void device_init_cpus(void) {
  for (int i = 0; i < GRAFT_CPU_DEVICES; i++) {
    devices[i].id = i;
    devices[i].kind = "cpu";
    devices[i].ordinal = i;
    snprintf(devices[i].name, sizeof devices[i].name, "host CPU (virtual device %d)", i);
  }
}

static pthread_once_t cpus_once = PTHREAD_ONCE_INIT;

const device_info *device_get(int id) {
  if (id < 0 || id >= GRAFT_MAX_DEVICES) return NULL;
  pthread_once(&cpus_once, device_init_cpus);
  if (id < GRAFT_CPU_DEVICES) return &devices[id];
  pthread_once(&discover_once, device_discover);
  return id < GRAFT_CPU_DEVICES + ndevices ? &devices[id] : NULL;
}

bool device_valid(int id) { return device_get(id) != NULL; }

/* The CPU ids never need discovery: this is on every allocation's path. */
bool device_is_host(int id) { return id < GRAFT_CPU_DEVICES || !device_get(id) || !device_get(id)->mem; }

const char *device_kind(int id) {
  const device_info *d = id < GRAFT_CPU_DEVICES ? NULL : device_get(id);
  return d ? d->kind : "cpu";
}

int device_count_known(void) { return GRAFT_CPU_DEVICES + ndevices; }

int device_count(void) {
  pthread_once(&discover_once, device_discover);
  return GRAFT_CPU_DEVICES + ndevices;
}

int device_register(const char *kind, const char *name, size_t memory, const device_mem *mem,
                    void *ctx) {
  int kinds = 0;
  if (GRAFT_CPU_DEVICES + ndevices >= GRAFT_MAX_DEVICES) return -1;
  for (int i = 0; i < ndevices; i++) kinds += !strcmp(devices[GRAFT_CPU_DEVICES + i].kind, kind);
  device_info *d = &devices[GRAFT_CPU_DEVICES + ndevices];
  d->id = GRAFT_CPU_DEVICES + ndevices;
  d->kind = kind;
  d->ordinal = kinds;
  snprintf(d->name, sizeof d->name, "%s", name);
  d->memory = memory;
  d->mem = mem;
  d->ctx = ctx;
  return GRAFT_CPU_DEVICES + ndevices++;
}

#define DEVICE_KINDS 4
static struct {
  const char *kind;
  char why[400];
} absent[DEVICE_KINDS];

void device_note_absent(const char *kind, const char *why) {
  for (int i = 0; i < DEVICE_KINDS; i++)
    if (!absent[i].kind || !strcmp(absent[i].kind, kind)) {
      absent[i].kind = kind;
      snprintf(absent[i].why, sizeof absent[i].why, "%s", why);
      return;
    }
}

const char *device_absent(const char *kind) {
  device_count();
  for (int i = 0; i < ndevices; i++)
    if (!strcmp(devices[GRAFT_CPU_DEVICES + i].kind, kind)) return NULL;
  for (int i = 0; i < DEVICE_KINDS && absent[i].kind; i++)
    if (!strcmp(absent[i].kind, kind)) return absent[i].why;
  return NULL;
}

const char *device_str(int id, char *buf, size_t n) {
  const device_info *d = device_get(id);
  if (!d) snprintf(buf, n, "device %d", id);
  else if (d->mem) snprintf(buf, n, "%s:%d (device %d, %s)", d->kind, d->ordinal, id, d->name);
  else snprintf(buf, n, "cpu:%d", id);
  return buf;
}

const char *device_list_str(char *buf, size_t n) {
  int total = device_count(), k = snprintf(buf, n, "0..%d cpu", GRAFT_CPU_DEVICES - 1);
  for (int i = GRAFT_CPU_DEVICES; i < total && k >= 0 && (size_t)k < n; i++)
    k += snprintf(buf + k, n - (size_t)k, ", %d %s:%d", i, devices[i].kind, devices[i].ordinal);
  if (total == GRAFT_CPU_DEVICES && k >= 0 && (size_t)k < n)
    snprintf(buf + k, n - (size_t)k, "; no accelerator found");
  return buf;
}

static _Atomic uint64_t t_up, t_up_bytes, t_down, t_down_bytes;

void device_count_upload(size_t bytes) {
  atomic_fetch_add(&t_up, 1);
  atomic_fetch_add(&t_up_bytes, bytes);
}

void device_count_download(size_t bytes) {
  atomic_fetch_add(&t_down, 1);
  atomic_fetch_add(&t_down_bytes, bytes);
}

void device_traffic_get(device_traffic *out) {
  out->uploads = atomic_load(&t_up);
  out->upload_bytes = atomic_load(&t_up_bytes);
  out->downloads = atomic_load(&t_down);
  out->download_bytes = atomic_load(&t_down_bytes);
}

void device_traffic_reset(void) {
  atomic_store(&t_up, 0);
  atomic_store(&t_up_bytes, 0);
  atomic_store(&t_down, 0);
  atomic_store(&t_down_bytes, 0);
}
