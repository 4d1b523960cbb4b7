// Removing a test's scratch directory without std::filesystem::remove_all.
//
// PyTorch's LibTorch 2.x wheels export the std::filesystem functions of the libstdc++ they link
// statically (pytorch/pytorch#133437); the dynamic linker binds a test's remove_all to libtorch's copy,
// which crashed (a call through a null pointer) in binaries built with the system's libstdc++. POSIX
// nftw has no twin in libtorch.
#pragma once

#include <ftw.h>
#include <stdio.h>

#include <cerrno>
#include <filesystem>

namespace ptrain::testing {

// Removes path and everything under it (symbolic links themselves, not their targets); what is
// already gone is no error.
inline void remove_tree(const std::filesystem::path& path) {
  ::nftw(
      path.c_str(),
      [](const char* entry, const struct stat*, int, struct FTW*) {
        return ::remove(entry) == 0 || errno == ENOENT ? 0 : -1;
      },
      16, FTW_DEPTH | FTW_PHYS);
}

}  // namespace ptrain::testing
