"""A name -> object table (data sources, tokenizers, HF families); a wrong name lists the valid ones."""

from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

from ablate.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, axis: str):
        self.axis = axis
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.axis}: option '{name}' registered twice")
            self._items[name] = obj
            return obj

        return deco

    def add(self, name: str, obj: T) -> None:
        self.register(name)(obj)

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            valid = ", ".join(self._items)
            raise ConfigError(f"unknown {self.axis} option '{name}'; valid options: {valid}") from None

    def names(self) -> list[str]:
        return list(self._items)

    def __contains__(self, name: str) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)
