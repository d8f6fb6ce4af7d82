/* IR nodes: op, operands, attributes, dtype, shape and a structural hash computed at
 * construction. A node is immutable once made; nodes are reference counted and shared. */
#ifndef GRAFT_IR_H
#define GRAFT_IR_H
#include "graft.h"
#include "dtype.h"
#include <stdbool.h>
#include <stdint.h>

typedef enum {
#define X(e, name, arity, kind, dts) IR_##e,
#include "ops.def"
#undef X
  IR_OP_COUNT
} ir_op;

typedef enum {
  IR_K_LEAF, IR_K_UNARY, IR_K_BINARY, IR_K_COMPARE, IR_K_SELECT,
  IR_K_MOVEMENT, IR_K_REDUCE, IR_K_CONTRACT, IR_K_SPECIAL,
  IR_K_COLLECTIVE /* runs across processes (ops.def): a side effect passes keep in place */
} ir_kind;

/* Dtype classes an op accepts. */
enum {
  IR_D_FLOAT = 1, IR_D_INT = 2, IR_D_BOOL = 4,
  IR_D_NUM = IR_D_FLOAT | IR_D_INT, IR_D_INTBOOL = IR_D_INT | IR_D_BOOL,
  IR_D_ANY = IR_D_FLOAT | IR_D_INT | IR_D_BOOL
};

typedef struct {
  const char *name;
  int arity;
  ir_kind kind;
  int dtypes;
} ir_opinfo;

extern const ir_opinfo ir_ops[IR_OP_COUNT];

#define IR_MAX_ATTRS 40
typedef struct {
  int64_t a[IR_MAX_ATTRS]; /* meaning per op: see ops.def */
  double f;
} ir_attrs;

struct exec_buffer;

typedef struct ir_node ir_node;
struct ir_node {
  int refcnt;
  ir_op op;
  graft_dtype dtype;
  int ndim;
  int64_t shape[GRAFT_MAX_DIMS];
  int64_t numel;
  ir_attrs attr;
  uint64_t lhash;  /* op, attrs, dtype, shape: what the node is, ignoring operands */
  uint64_t hash;   /* lhash combined with the operands' hashes (structural, for CSE) */
  int nattr;       /* attr.a[nattr..] are all zero (0 for data leaves: attrs not hashed) */
  struct exec_buffer *data; /* IR_DATA only: the device data */
  int device;
  /* scratch for graph capture; valid only under the global lock during one capture */
  uint64_t mark;
  int32_t slot;
  int nin;
  ir_node *in[]; /* operands */
};

/* Hash mixing (64-bit, splitmix-style finalizer). */
static inline uint64_t ir_mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h ^= h >> 31; h *= 0xbf58476d1ce4e5b9ull; h ^= h >> 29;
  return h;
}

/* Makes a node after validating operands against the op (dtypes, shapes, attrs); infers the
 * shape for every op but BROADCAST/RESHAPE/CONSTANT/IOTA/RNG/DATA, which take (ndim, shape).
 * out_dtype is used by CONVERT, CONSTANT, IOTA, RNG, DATA; ignored otherwise (-1 ok).
 * Returns a new reference, or NULL with the thread error set. Operands are not consumed. */
ir_node *ir_make(ir_op op, int nin, ir_node *const *in, const ir_attrs *attr,
                 graft_dtype out_dtype, int ndim, const int64_t *shape);
/* ir_make for a node with no operands (CONSTANT, IOTA) on the given device (0..3); a node with
 * operands is on its operands' device and must be given that device. */
ir_node *ir_make_on(ir_op op, int nin, ir_node *const *in, const ir_attrs *attr,
                    graft_dtype out_dtype, int ndim, const int64_t *shape, int device);
/* A data leaf over buf (takes a reference to buf). */
ir_node *ir_make_data(struct exec_buffer *buf, graft_dtype dt, int ndim, const int64_t *shape,
                      int device);
void ir_retain(ir_node *n);
void ir_release(ir_node *n);
/* Pending (non-leaf-data) nodes alive now. */
int64_t ir_pending_count(void);
/* Collective nodes alive now (pending: a collective never becomes data itself). */
int64_t ir_collective_count(void);
/* Writes "[2,3]" into buf. */
const char *ir_shape_str(int ndim, const int64_t *shape, char *buf, size_t n);
/* Writes one line describing the node's attributes (empty when none). */
void ir_attr_str(const ir_node *n, char *buf, size_t size);
/* The same from the parts a program instruction keeps (nd: dims of operand 0, else its own). */
void ir_attr_fmt(ir_op op, const ir_attrs *attr, int nd, char *buf, size_t size);
int64_t ir_numel(int ndim, const int64_t *shape);
#endif
