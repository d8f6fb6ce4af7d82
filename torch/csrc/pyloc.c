/* The Python line an aten op was called from: the innermost frame outside torch and graft,
 * read from the calling thread's own frame stack (CPython's internal frame layout, 3.11-3.13)
 * without taking the GIL, and handed to graft_set_location so each traced node carries it and
 * a recompile names that line. The per-op cost is a walk of a few frame pointers and two
 * lookups in this file's tables; a code object seen for the first time is classified (its
 * file name read, a reference kept so its address is never reused) under the GIL, before the
 * bridge takes its own lock. Other Python versions record no location (the reasons say less). */
#define Py_BUILD_CORE 1
#if __has_include(<Python.h>) /* no Python headers (no python3-dev): no locations */
#include <Python.h>
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000
#include <internal/pycore_frame.h>
#define PYLOC_FRAMES 1
#endif
#endif
#include "graft.h"
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void graftpt_pyloc_configure(const char *const *prefixes, int n, int on);
void graftpt_pyloc_capture(void);

#ifdef PYLOC_FRAMES
#define PYLOC_DEPTH 64      /* frames walked at most */
#define PYLOC_CODES 16384   /* code objects classified at most (power of two) */
#define PYLOC_LINES 65536   /* (code, instruction) -> line entries at most (power of two) */
#define PYLOC_PREFIXES 4

typedef struct {
  const void *code;
  const char *file; /* NULL: inside torch or graft (skipped) */
} pyloc_code;

typedef struct {
  const void *code;
  int lasti, line;
} pyloc_line;

static pthread_mutex_t pyloc_mu = PTHREAD_MUTEX_INITIALIZER;
static pyloc_code pyloc_codes[PYLOC_CODES];
static pyloc_line pyloc_lines[PYLOC_LINES];
static int pyloc_ncodes, pyloc_nlines;
static char *pyloc_internal[PYLOC_PREFIXES]; /* folders whose frames are skipped */
static int pyloc_on;


/* Called once by the bridge's set-up op: the folders of torch and graft; on: record. */
void graftpt_pyloc_configure(const char *const *prefixes, int n, int on) {
  if ((Py_Version >> 16) != (PY_VERSION_HEX >> 16)) on = 0; /* built for another Python's frames */
  pthread_mutex_lock(&pyloc_mu);
  for (int i = 0; i < PYLOC_PREFIXES; i++) {
    free(pyloc_internal[i]);
    pyloc_internal[i] = i < n && prefixes[i] && *prefixes[i] ? strdup(prefixes[i]) : NULL;
  }
  __atomic_store_n(&pyloc_on, on, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&pyloc_mu);
}

static size_t pyloc_slot(const void *p, int extra, size_t mask) {
  uint64_t h = ((uint64_t)(uintptr_t)p ^ (uint64_t)(uint32_t)extra * 0x9e3779b97f4a7c15ull) * 0xbf58476d1ce4e5b9ull;
  return (size_t)(h >> 32) & mask;
}

/* Under pyloc_mu: the entry of code object co (file NULL: internal), or NULL when unseen. */
static pyloc_code *pyloc_find_code(const void *co, int *seen) {
  size_t m = PYLOC_CODES - 1;
  for (size_t i = pyloc_slot(co, 0, m);; i = (i + 1) & m) {
    if (pyloc_codes[i].code == co) {
      *seen = 1;
      return &pyloc_codes[i];
    }
    if (!pyloc_codes[i].code) {
      *seen = 0;
      return &pyloc_codes[i];
    }
  }
}

static int pyloc_is_internal(const char *file) {
  if (file[0] == '<') return 1; /* <frozen importlib...>, <string> */
  for (int i = 0; i < PYLOC_PREFIXES; i++)
    if (pyloc_internal[i] && !strncmp(file, pyloc_internal[i], strlen(pyloc_internal[i]))) return 1;
  return 0;
}

/* Classifies code object co under the GIL (not under pyloc_mu: another thread holding the
 * GIL may be waiting for it); keeps a reference so its address stays its own. Returns its
 * file name (malloc'd), or NULL for code inside torch or graft. */
static const char *pyloc_classify(PyCodeObject *co) {
  PyGILState_STATE g = PyGILState_Ensure();
  PyObject *et, *ev, *tb; /* an exception the thread has pending stays pending */
  PyErr_Fetch(&et, &ev, &tb);
  const char *name = co->co_filename ? PyUnicode_AsUTF8(co->co_filename) : NULL;
  char *file = NULL;
  if (!name) PyErr_Clear();
  pthread_mutex_lock(&pyloc_mu);
  int internal = !name || pyloc_is_internal(name);
  pthread_mutex_unlock(&pyloc_mu);
  if (!internal) file = strdup(name);
  PyErr_Restore(et, ev, tb);
  Py_INCREF((PyObject *)co);
  PyGILState_Release(g);
  return file;
}

static _PyInterpreterFrame *pyloc_top(PyThreadState *ts) {
#if PY_VERSION_HEX >= 0x030D0000
  return ts->current_frame;
#else
  return ts->cframe ? ts->cframe->current_frame : NULL;
#endif
}

static PyCodeObject *pyloc_code_of(_PyInterpreterFrame *f) {
#if PY_VERSION_HEX >= 0x030D0000
  return PyCode_Check(f->f_executable) ? (PyCodeObject *)f->f_executable : NULL;
#else
  return f->f_code;
#endif
}

/* Under pyloc_mu. */
static int pyloc_line_of(PyCodeObject *co, int lasti) {
  size_t m = PYLOC_LINES - 1;
  int line = 0, found = 0;
  size_t i = pyloc_slot(co, lasti, m);
  for (;; i = (i + 1) & m) {
    if (pyloc_lines[i].code == co && pyloc_lines[i].lasti == lasti) {
      line = pyloc_lines[i].line;
      found = 1;
      break;
    }
    if (!pyloc_lines[i].code) break;
  }
  if (!found) {
    line = PyCode_Addr2Line(co, lasti * (int)sizeof(_Py_CODEUNIT)); /* reads the code's own table */
    if (line < 0) line = co->co_firstlineno;                      /* an instruction with no line */
    if (pyloc_nlines < PYLOC_LINES / 2) {
      pyloc_lines[i] = (pyloc_line){co, lasti, line};
      pyloc_nlines++;
    }
  }
  return line;
}

/* Sets graft's location from the calling thread's Python frames (clears it where there are
 * none: autograd's own threads, C++ callers). */
void graftpt_pyloc_capture(void) {
  if (!__atomic_load_n(&pyloc_on, __ATOMIC_RELAXED)) return;
  PyThreadState *ts = PyGILState_GetThisThreadState();
  _PyInterpreterFrame *f = ts ? pyloc_top(ts) : NULL;
  const char *file = NULL;
  int line = 0;
  pthread_mutex_lock(&pyloc_mu); /* one lock for the walk; released only to classify */
  for (int depth = 0; f && depth < PYLOC_DEPTH && !file; f = f->previous, depth++) {
    PyCodeObject *co = _PyFrame_IsIncomplete(f) ? NULL : pyloc_code_of(f);
    if (!co) continue;
    int seen;
    pyloc_code *e = pyloc_find_code(co, &seen);
    if (!seen) {
      if (pyloc_ncodes >= PYLOC_CODES / 2) break;
      pthread_mutex_unlock(&pyloc_mu);
      const char *named = pyloc_classify(co);
      pthread_mutex_lock(&pyloc_mu);
      e = pyloc_find_code(co, &seen);
      if (!seen) {
        *e = (pyloc_code){co, named};
        pyloc_ncodes++;
      } else { /* another thread classified it meanwhile */
        free((char *)named);
      }
    }
    file = e->file;
    if (file) line = pyloc_line_of(co, _PyInterpreterFrame_LASTI(f));
  }
  pthread_mutex_unlock(&pyloc_mu);
  graft_set_location(file, line);
}
#else
void graftpt_pyloc_configure(const char *const *prefixes, int n, int on) {
  (void)prefixes, (void)n, (void)on;
}
void graftpt_pyloc_capture(void) {}
#endif
