# Points the installed llama-server and libmtmd at the libraries they must load:
#   cmake -DSERVER=... -DMTMD=... -DRPATH=... -DMTMD_RPATH=... -P set-rpath.cmake
cmake_minimum_required(VERSION 3.21)
file(RPATH_SET FILE "${SERVER}" NEW_RPATH "${RPATH}")
file(RPATH_SET FILE "${MTMD}" NEW_RPATH "${MTMD_RPATH}")
