#include "test_losses_ref.h"
