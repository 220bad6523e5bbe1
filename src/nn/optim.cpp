#include "optim.h"
