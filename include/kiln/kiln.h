// Kiln: differentiable programming in C++. Include this one header.
#pragma once

#include "kiln/control_flow.h"
#include "kiln/data.h"
#include "kiln/dtype.h"
#include "kiln/error.h"
#include "kiln/io.h"
#include "kiln/ir.h"
#include "kiln/nn.h"
#include "kiln/ops.h"
#include "kiln/optim.h"
#include "kiln/primitive.h"
#include "kiln/progress.h"
#include "kiln/random.h"
#include "kiln/shape.h"
#include "kiln/tensor.h"
#include "kiln/transforms.h"
#include "kiln/tree.h"
