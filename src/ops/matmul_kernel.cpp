// matmul CPU micro-kernel (filled in by the matmul work)
