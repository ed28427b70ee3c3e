// One-row products of small matrices as a multiply and a sum, which fuse into one loop nest:
// decoding against a key/value cache multiplies each head's query row by its keys and its
// weights by its values, and a library call per such product cost more than the product (XLA's
// algebraic simplifier reduces vector-matrix dots the same way). Compiled code only: the
// interpreter, the reference, keeps the products.
#pragma once

#include "kiln/ir.h"

namespace kiln::compiler {

// f, and its sub-functions, with each float matmul [..., 1, k] x [..., k, n] of at least two
// matrices with k * n at most 2^16 written as mul and reduce_sum: over the last axis of the
// broadcast row times the matrix b transposes when b is a transpose (the keys, read along
// their rows), else over k of the row's column times b when n >= 8 (a sum keeping shorter rows
// runs the reduction's kernel, after a multiply written to memory).
ir::Function reduce_thin_products(const ir::Function& f);

}  // namespace kiln::compiler
