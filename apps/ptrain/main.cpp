#include <iostream>
#include "ptrain/core/torch_compat.h"
int main() { std::cout << "ptrain on LibTorch " << ptrain::compat::torch_version() << "\n"; }
